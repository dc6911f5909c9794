// A synthetic cluster in which every dashboard panel has something to show: input series
// for the promtool test of tests/mixin/test_dashboards.py (evaluated with the rules).
local f = import 'tests/fixtures.libsonnet';
local t = import 'tests/lib.libsonnet';

local node = f.nodeExporter;
local gpus = ['GPU-a', 'GPU-b', 'GPU-x', 'GPU-w1', 'GPU-d'];
local container(pod, gpu, namespace='ml', workload='chat', name='vllm') =
  node { namespace: namespace, pod: pod, pod_uid: 'uid-' + pod, container: name, workload: workload, gpu_uuid: gpu };

// Sticky routing in `chat`: chat-a full and queueing, chat-b nearly idle, one more pending.
f.engine('chat-a', waiting=12, running=8, kv=0.5, maxNumSeqs=8, gpus=['GPU-a'], preemptionsPerMinute=2)
+ f.engine('chat-b', waiting=0, running=1, kv=0.05, maxNumSeqs=8, gpus=['GPU-b'])
+ f.pendingPod('chat-c', 'insufficient_gpu', 1)
// `chat` is behind an InferencePool whose picker holds requests (flow control on).
+ f.inferencePool('chat-pool', [['chat-a', 'chat', true], ['chat-b', 'chat', true]], queued=5, ready=2, saturation=0.9)
// `summarize` is loading its model.
+ f.startingPod('summarize-a', workload='summarize')
+ f.engine('summarize-a', workload='summarize', up=0, gpus=[])
// The ledger of gpu-node-1.
+ f.allocation('chat-a', ['GPU-a', 'GPU-x'])
+ f.allocation('chat-b', ['GPU-b'])
// A trainer whose GPU came through a DRA ResourceClaim, beside the device-plugin pods.
+ f.draAllocation('trainer', 'GPU-d', 'gpu-claim', 'gpu-4')
+ f.ledgerFlag('gpuledger_gpu_allocated_unused', 'trainer', 'GPU-d', value=0, workload='trainer', container='main')
+ f.ledgerFlag('gpuledger_gpu_allocated_unused', 'chat-a', 'GPU-x')
+ f.ledgerFlag('gpuledger_gpu_unallocated_use', 'notebook-x', 'GPU-b', namespace='research', workload='notebook-x', container='jupyter')
+ [
  t.gauge('gpuledger_gpu_info', node { gpu_uuid: gpus[i], gpu_index: std.toString(i), model: 'NVIDIA H100 80GB HBM3', pci_bus_id: '00000000:%02d:00.0' % (i + 1), mig_mode: 'disabled' }, 1)
  for i in std.range(0, std.length(gpus) - 1)
]
+ std.flattenArrays([
  [
    t.gauge('gpuledger_gpu_up', node { gpu_uuid: g }, 1),
    t.gauge('gpuledger_gpu_memory_total_bytes', node { gpu_uuid: g }, 85899345920),
    t.gauge('gpuledger_gpu_memory_used_bytes', node { gpu_uuid: g }, 42949672960),
    t.gauge('gpuledger_gpu_utilization_ratio', node { gpu_uuid: g }, 0.6),
    t.gauge('gpuledger_unattributed_gpu_memory_used_bytes', node { gpu_uuid: g }, 524288000),
  ]
  for g in gpus
])
+ [
  t.gauge('gpuledger_container_gpu_memory_used_bytes', container('chat-a', 'GPU-a'), 70000000000),
  t.gauge('gpuledger_container_gpu_memory_used_bytes', container('chat-b', 'GPU-b'), 60000000000),
  t.gauge('gpuledger_container_gpu_memory_used_bytes', container('notebook-x', 'GPU-b', 'research', 'notebook-x', 'jupyter'), 8000000000),
  t.gauge('gpuledger_container_gpu_processes', container('chat-a', 'GPU-a'), 1),
  t.gauge('gpuledger_container_gpu_processes', container('chat-b', 'GPU-b'), 1),
  t.gauge('gpuledger_container_device_info', node { namespace: 'ml', pod: 'chat-a', pod_uid: 'uid-chat-a', container: 'vllm', local_index: '0', gpu_uuid: 'GPU-a', source: 'env' }, 1),
  t.gauge('gpuledger_container_device_info', node { namespace: 'ml', pod: 'chat-a', pod_uid: 'uid-chat-a', container: 'vllm', local_index: '1', gpu_uuid: 'GPU-x', source: 'env' }, 1),
]
// A GPU in MIG mode with two MIG devices, one of them used by a pod.
+ [
  t.gauge('gpuledger_gpu_info', node { gpu_uuid: 'GPU-m', gpu_index: '4', model: 'NVIDIA H100 80GB HBM3', pci_bus_id: '00000000:05:00.0', mig_mode: 'enabled' }, 1),
  t.gauge('gpuledger_gpu_up', node { gpu_uuid: 'GPU-m' }, 1),
  t.gauge('gpuledger_gpu_memory_used_bytes', node { gpu_uuid: 'GPU-m' }, 3221225472),
]
+ std.flattenArrays([
  [
    t.gauge('gpuledger_mig_device_info', node { gpu_uuid: m[0], parent_gpu_uuid: 'GPU-m', mig_index: m[1], profile: '1g.10gb', gpu_instance_id: m[2], compute_instance_id: '0' }, 1),
    t.gauge('gpuledger_gpu_up', node { gpu_uuid: m[0], parent_gpu_uuid: 'GPU-m' }, 1),
    t.gauge('gpuledger_gpu_memory_total_bytes', node { gpu_uuid: m[0], parent_gpu_uuid: 'GPU-m' }, 10737418240),
    t.gauge('gpuledger_gpu_memory_used_bytes', node { gpu_uuid: m[0], parent_gpu_uuid: 'GPU-m' }, m[3]),
  ]
  for m in [['MIG-m0', '0', '7', 3221225472], ['MIG-m1', '1', '8', 0]]
])
+ [t.gauge('gpuledger_container_gpu_memory_used_bytes', container('tiny-a', 'MIG-m0', workload='tiny') { parent_gpu_uuid: 'GPU-m' }, 3221225472)]
// Ray: a worker pod with 2 logical GPUs on 1 allocated one, an actor using it, and work
// that waits for more.
+ f.rayNode('ray-llm-worker-a', 'node-a', 2, 0, allocated=1)
+ f.allocation('ray-llm-worker-a', ['GPU-w1'], namespace='ray', container='ray-worker')
+ [
  t.gauge('gpuledger_container_gpu_memory_used_bytes', container('ray-llm-worker-a', 'GPU-w1', 'ray', 'ray-llm', 'ray-worker'), 30000000000),
  t.gauge('gpuledger_ray_actor_gpus', node { namespace: 'ray', pod: 'ray-llm-worker-a', pod_uid: 'uid-ray-llm-worker-a', workload: 'ray-llm', class_name: 'LLMServer', state: 'ALIVE' }, 1),
  t.gauge('gpuledger_ray_actor_gpus', node { namespace: 'ray', pod: 'ray-llm-worker-a', pod_uid: 'uid-ray-llm-worker-a', workload: 'ray-llm', class_name: 'LLMServer', state: 'PENDING_CREATION' }, 1),
  t.gauge('gpuledger_ray_actors_without_gpu_memory', node { namespace: 'ray', pod: 'ray-llm-worker-a', pod_uid: 'uid-ray-llm-worker-a', workload: 'ray-llm', class_name: 'LLMServer' }, 0),
  t.gauge('gpuledger_ray_actor_gpu_memory_used_bytes', node { namespace: 'ray', pod: 'ray-llm-worker-a', pod_uid: 'uid-ray-llm-worker-a', class_name: 'LLMServer', gpu_uuid: 'GPU-w1' }, 30000000000),
]
+ f.rayPlacementGroups('ray-llm', 'NO_RESOURCES', 1, namespace='ray')
+ f.rayPendingGpus('ray-llm', 'actor', 1, namespace='ray')
// Ray Serve: 30 requests wait at the router of `serve-llm` while its replicas idle.
+ f.serveDeployment('llm', 'LLMServer', 30, atReplicas=2, replicas=[['serve-llm-worker-a', 'q3xk7a1m', 1], ['serve-llm-worker-b', 'v9d2m5pz', 1]], workload='serve-llm')
// An engine on the Ray executor (TP 2): its EngineCore drives Ray job 02000000, whose two
// workers run in ray-tp-worker-a on this node, one GPU each.
+ f.engine('ray-tp-head', namespace='ray', workload='ray-tp', tp=2, gpus=[])
+ [
  t.gauge('gpuledger_engine_ray_job_info', node + f.engineKey('ray-tp-head', 'ray', 'ray-tp') { ray_job_id: '02000000', ray_driver_node_id: 'n0de' }, 1),
  t.gauge('gpuledger_engine_ray_workers', node + f.engineKey('ray-tp-head', 'ray', 'ray-tp') { state: 'ALIVE' }, 2),
]
+ std.flattenArrays([
  [
    t.gauge('gpuledger_ray_worker_info', node { namespace: 'ray', pod: 'ray-tp-worker-a', pod_uid: 'uid-ray-tp-worker-a', workload: 'ray-tp', ray_job_id: '02000000', ray_driver_node_id: 'n0de', class_name: 'RayWorkerProc', bundle_index: w[0], tp_rank: w[0], pp_rank: '0' }, 1),
    t.gauge('gpuledger_ray_worker_gpu_memory_used_bytes', node { namespace: 'ray', pod: 'ray-tp-worker-a', pod_uid: 'uid-ray-tp-worker-a', ray_job_id: '02000000', ray_driver_node_id: 'n0de', bundle_index: w[0], tp_rank: w[0], pp_rank: '0', gpu_uuid: w[1] }, 30000000000),
  ]
  for w in [['0', 'GPU-a'], ['1', 'GPU-b']]
])
// The links between GPUs (state sets): chat-a across NUMA nodes, the Ray engine's two
// ranks on this node over NVLink.
+ [
  t.gauge('gpuledger_engine_gpu_link_weakest', node + f.engineKey('chat-a') { link: l }, if l == 'system' then 1 else 0)
  for l in ['nvlink', 'internal', 'single', 'multiple', 'hostbridge', 'node', 'system', 'unknown']
]
+ [
  t.gauge('gpuledger_ray_engine_gpu_link_weakest', node { namespace: 'ray', pod: 'ray-tp-worker-a', pod_uid: 'uid-ray-tp-worker-a', workload: 'ray-tp', ray_job_id: '02000000', ray_driver_node_id: 'n0de', link: l }, if l == 'nvlink' then 1 else 0)
  for l in ['nvlink', 'internal', 'single', 'multiple', 'hostbridge', 'node', 'system', 'unknown']
]
// Self-monitoring.
+ f.sources()
+ [
  // Real hardware (`gpuledger serve`): no simulated-data banner.
  t.gauge('gpuledger_build_info', node { version: '0.1.0', simulated: 'false' }, 1),
  t.gauge('gpuledger_snapshot_age_seconds', node, 4),
  t.gauge('up', node, 1),
]
// chat-a's request spans (docs/spans.md): its queue-time and time-to-first-token
// histograms, cumulative buckets growing every minute.
+ [
  t.counter(family + '_bucket', node + f.engineKey('chat-a') { le: b.le }, b.perMinute)
  for family in ['gpuledger_engine_request_queue_seconds', 'gpuledger_engine_request_ttft_seconds']
  for b in [{ le: '0.5', perMinute: 30 }, { le: '1', perMinute: 50 }, { le: '+Inf', perMinute: 60 }]
]
