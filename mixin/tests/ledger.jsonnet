// Ledger layer: what Kubernetes allocated vs what processes use vs what Ray believes.
local f = import 'fixtures.libsonnet';
local t = import 'lib.libsonnet';
local c = t.config;

local unusedAlert = t.alert(
  'GpuLedgerGpuAllocatedUnused',
  {
    node: 'gpu-node-1',
    namespace: 'ml',
    workload: 'embed',
    pod: 'embed-a',
    pod_uid: 'uid-embed-a',
    container: 'vllm',
    gpu_uuid: 'GPU-e2',
  },
  'GPU GPU-e2 on node gpu-node-1 has been allocated to container vllm of pod ml/embed-a (workload embed) for %s, but no process of that container holds a context on it.' % c.gpuAllocatedUnusedFor,
);

local procfsDown = t.alert(
  'GpuLedgerSourceDown',
  f.nodeExporter { source: 'procfs' },
  'Source procfs of the gpuledger exporter on node gpu-node-1 (10.0.0.11:9402) has failed every fetch for %s (reason timeout); its series are missing until it recovers.' % c.sourceDownFor,
);

// Serving with one GPU; the pod asked for two.
local allocatedUnused =
  f.engine('embed-a', workload='embed', running=2, gpus=['GPU-e1'])
  + f.allocation('embed-a', ['GPU-e1', 'GPU-e2'])
  + f.ledgerFlag('gpuledger_gpu_allocated_unused', 'embed-a', 'GPU-e1', value=0, workload='embed')
  + f.ledgerFlag('gpuledger_gpu_allocated_unused', 'embed-a', 'GPU-e2', workload='embed');

// A MIG device (mixed strategy) allocated and never opened, while its sibling on the same
// GPU is used: the alert names the MIG device and its GPU.
local migKey = {
  node: 'gpu-node-1',
  namespace: 'ml',
  workload: 'tiny',
  pod: 'tiny-a',
  pod_uid: 'uid-tiny-a',
  container: 'vllm',
};
local migUnused = [
  t.gauge('gpuledger_gpu_allocation_info', f.nodeExporter + migKey { gpu_uuid: mig, parent_gpu_uuid: 'GPU-m', resource: 'nvidia.com/mig-1g.10gb' } + { workload:: null }, 1)
  for mig in ['MIG-m0', 'MIG-m1']
] + [
  t.gauge('gpuledger_gpu_allocated_unused', f.nodeExporter + migKey { gpu_uuid: 'MIG-m0', parent_gpu_uuid: 'GPU-m' }, 0),
  t.gauge('gpuledger_gpu_allocated_unused', f.nodeExporter + migKey { gpu_uuid: 'MIG-m1', parent_gpu_uuid: 'GPU-m' }, 1),
];

// DRA (Kubernetes 1.34): the trainer's process uses GPU-d2. allocated: its ResourceClaim
// holds GPU-d2, so the exporter (PodResources dynamic_resources, resolved through the
// node's ResourceSlices) says it is allocated; else the claim's allocation is absent.
local draTrainer(allocated) =
  (if allocated then f.draAllocation('trainer', 'GPU-d2', 'gpu-claim', 'gpu-2') else [])
  + f.ledgerFlag('gpuledger_gpu_unallocated_use', 'trainer', 'GPU-d2', value=if allocated then 0 else 1, workload='trainer', container='main')
  + (if allocated then f.ledgerFlag('gpuledger_gpu_allocated_unused', 'trainer', 'GPU-d2', value=0, workload='trainer', container='main') else [])
  // A GPU pod by its claim (no nvidia.com/gpu request), placed and Ready.
  + [t.gauge('gpuledger_pod_starting', f.nodeExporter { namespace: 'ml', pod: 'trainer', pod_uid: 'uid-trainer', workload: 'trainer' }, 0)]
  + f.sources();

local doubleBookingDescription(pod, rayNode, total, allocated) =
  'Ray node %s in pod ray/%s has advertised %d logical GPU(s) for %s, but Kubernetes allocated %d GPU(s) to the pod: Ray can schedule GPU actors onto GPUs the pod does not own (double booking).'
  % [rayNode, pod, total, c.rayGpusExceedAllocationFor, allocated];
local rayKey(pod, rayNode) = { node: 'gpu-node-1', namespace: 'ray', pod: pod, pod_uid: 'uid-' + pod, ray_node_id: rayNode };

t.file([
  t.scenario(
    'GPU allocated but unused',
    allocatedUnused + f.sources(),
    fires=[unusedAlert],
    stages={ 'ml/embed': 'serving' },
  ),

  t.scenario(
    'MIG device allocated but unused',
    migUnused + f.sources(),
    fires=[
      t.alert(
        'GpuLedgerGpuAllocatedUnused',
        migKey { gpu_uuid: 'MIG-m1', parent_gpu_uuid: 'GPU-m' },
        'MIG device MIG-m1 of GPU GPU-m on node gpu-node-1 has been allocated to container vllm of pod ml/tiny-a (workload tiny) for %s, but no process of that container holds a context on it.' % c.gpuAllocatedUnusedFor,
      ),
    ],
  ),

  // The same ledger while procfs fails: the ledger is blind, the source alert says so.
  t.scenario(
    'GPU allocated but unused while procfs is down: only the source alert',
    allocatedUnused + f.sources(down=['procfs']),
    fires=[procfsDown],
    stages={ 'ml/embed': 'serving' },
  ),

  // The same from an exporter without gpuledger_source_state: source_up 0 silences.
  t.scenario(
    'GPU allocated but unused while procfs is down, exporter without gpuledger_source_state: only the source alert',
    allocatedUnused + f.sources(down=['procfs'], state=false),
    fires=[procfsDown],
    stages={ 'ml/embed': 'serving' },
  ),

  // A ledger source this exporter reports not configured (source_up 0 as well) is not a
  // blind ledger: it silences nothing.
  t.scenario(
    'GPU allocated but unused, a ledger source not configured: the ledger alert',
    allocatedUnused + f.sources(disabled=['podresources']),
    fires=[unusedAlert],
    stages={ 'ml/embed': 'serving' },
  ),

  t.scenario(
    'GPU used without allocation',
    f.ledgerFlag('gpuledger_gpu_unallocated_use', 'notebook-x', 'GPU-n1', namespace='research', workload='notebook-x', container='jupyter')
    + f.sources(),
    fires=[
      t.alert(
        'GpuLedgerGpuUnallocatedUse',
        {
          node: 'gpu-node-1',
          namespace: 'research',
          workload: 'notebook-x',
          pod: 'notebook-x',
          pod_uid: 'uid-notebook-x',
          container: 'jupyter',
          gpu_uuid: 'GPU-n1',
        },
        'Container jupyter of pod research/notebook-x (workload notebook-x) has been using GPU GPU-n1 on node gpu-node-1 for %s without Kubernetes allocating it to that container.' % c.gpuUnallocatedUseFor,
      ),
    ],
    // It requests no GPU, but uses one: a GPU workload without an engine.
    stages={ 'research/notebook-x': 'no_engine' },
  ),

  t.scenario(
    'GPU used through its DRA claim: silent',
    draTrainer(allocated=true),
    stages={ 'ml/trainer': 'no_engine' },
  ),

  t.scenario(
    'GPU used while its DRA allocation is absent',
    draTrainer(allocated=false),
    fires=[
      t.alert(
        'GpuLedgerGpuUnallocatedUse',
        {
          node: 'gpu-node-1',
          namespace: 'ml',
          workload: 'trainer',
          pod: 'trainer',
          pod_uid: 'uid-trainer',
          container: 'main',
          gpu_uuid: 'GPU-d2',
        },
        'Container main of pod ml/trainer (workload trainer) has been using GPU GPU-d2 on node gpu-node-1 for %s without Kubernetes allocating it to that container.' % c.gpuUnallocatedUseFor,
      ),
    ],
    stages={ 'ml/trainer': 'no_engine' },
  ),

  t.scenario(
    'double booking: Ray logical GPUs exceed the pod allocation',
    // 4 logical GPUs on 2 allocated ones; 2 on none; 2 on 2 (fine); 8 on unknown (silent).
    f.rayNode('ray-llm-worker-a', 'node-a', 4, 0, allocated=2) + f.allocation('ray-llm-worker-a', ['GPU-w1', 'GPU-w2'], namespace='ray', container='ray-worker')
    + f.rayNode('ray-llm-worker-b', 'node-b', 2, 2, allocated=0)
    + f.rayNode('ray-llm-worker-c', 'node-c', 2, 1, allocated=2) + f.allocation('ray-llm-worker-c', ['GPU-w3', 'GPU-w4'], namespace='ray', container='ray-worker')
    + f.rayNode('ray-llm-worker-d', 'node-d', 8, 8)
    + f.sources(),
    fires=[
      t.alert('GpuLedgerRayGpusExceedAllocation', rayKey('ray-llm-worker-a', 'node-a'), doubleBookingDescription('ray-llm-worker-a', 'node-a', 4, 2)),
      t.alert('GpuLedgerRayGpusExceedAllocation', rayKey('ray-llm-worker-b', 'node-b'), doubleBookingDescription('ray-llm-worker-b', 'node-b', 2, 0)),
    ],
    exprs=[
      t.expr('node_namespace_pod:gpuledger_gpu_allocation_info:count', {
        'node_namespace_pod:gpuledger_gpu_allocation_info:count{namespace="ray",node="gpu-node-1",pod="ray-llm-worker-a",pod_uid="uid-ray-llm-worker-a"}': 2,
        'node_namespace_pod:gpuledger_gpu_allocation_info:count{namespace="ray",node="gpu-node-1",pod="ray-llm-worker-c",pod_uid="uid-ray-llm-worker-c"}': 2,
      }),
    ],
  ),

  t.scenario(
    'Ray within its allocation: silent',
    f.rayNode('ray-llm-worker-c', 'node-c', 2, 0, allocated=2) + f.allocation('ray-llm-worker-c', ['GPU-w3', 'GPU-w4'], namespace='ray', container='ray-worker')
    + f.sources(),
  ),
])
