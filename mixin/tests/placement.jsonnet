// Placement layer: Kubernetes pending pods and Ray placement groups.
local f = import 'fixtures.libsonnet';
local t = import 'lib.libsonnet';
local c = t.config;

local pendingDescription(count, workload, reasonText, reason) =
  '%d GPU pod(s) of workload %s have been pending placement for %s: %s (reason %s).'
  % [count, workload, c.podsPendingPlacementFor, reasonText, reason]
  + t.nextStep('pending_placement', reason);

t.file([
  t.scenario(
    'pending for GPU capacity',
    f.pendingPod('chat-c', 'insufficient_gpu', 2)
    + f.pendingPod('chat-d', 'insufficient_gpu', 1)
    // A pod without GPUs is no GPU placement problem: not counted.
    + f.pendingPod('chat-router', 'taint', 0),
    fires=[
      t.alert(
        'GpuLedgerPodsPendingPlacement',
        { namespace: 'ml', workload: 'chat', reason: 'insufficient_gpu' },
        pendingDescription(2, 'ml/chat', 'no node that would take the pod has enough free GPUs', 'insufficient_gpu'),
      ),
    ],
    stages={ 'ml/chat': 'pending_placement:insufficient_gpu' },
    exprs=[
      t.expr('namespace_workload_reason:gpuledger_pod_pending_placement:sum', {
        'namespace_workload_reason:gpuledger_pod_pending_placement:sum{namespace="ml",reason="insufficient_gpu",workload="chat"}': 2,
      }),
      t.expr('namespace_workload:gpuledger_pod_pending_gpus:sum', {
        'namespace_workload:gpuledger_pod_pending_gpus:sum{namespace="ml",workload="chat"}': 3,
      }),
    ],
  ),

  t.scenario(
    'pending on node selector',
    f.pendingPod('chat-c', 'node_selector', 1),
    fires=[
      t.alert(
        'GpuLedgerPodsPendingPlacement',
        { namespace: 'ml', workload: 'chat', reason: 'node_selector' },
        pendingDescription(1, 'ml/chat', "no node matches the pod's node selector or node affinity", 'node_selector'),
      ),
    ],
    stages={ 'ml/chat': 'pending_placement:node_selector' },
  ),

  t.scenario(
    'pending behind a scheduling gate (Kueue)',
    f.pendingPod('batch-a', 'scheduling_gated', 4, workload='batch'),
    fires=[
      t.alert(
        'GpuLedgerPodsPendingPlacement',
        { namespace: 'ml', workload: 'batch', reason: 'scheduling_gated' },
        pendingDescription(1, 'ml/batch', 'a scheduling gate holds the pod (queue admission such as Kueue quota)', 'scheduling_gated'),
      ),
    ],
    stages={ 'ml/batch': 'pending_placement:scheduling_gated' },
  ),

  // The exporter cannot tell the RayCluster's namespace: the stage is broadcast to the
  // namespaced workload of that name, and no namespace-less stage series remains. Its
  // engines queue with a full KV cache, and still no engine alert fires.
  t.scenario(
    'Ray placement group infeasible',
    f.rayPlacementGroups('ray-llm', 'INFEASIBLE', 1)
    + f.rayPendingGpus('ray-llm', 'placement_group', 16)
    + f.engine('ray-llm-head', namespace='ray', workload='ray-llm', waiting=6, running=4, kv=0.97, gpus=['GPU-r1']),
    fires=[
      t.alert(
        'GpuLedgerRayPlacementGroupsInfeasible',
        { workload: 'ray-llm', scheduling_state: 'INFEASIBLE' },
        '1 Ray placement group(s) of workload ray-llm have been INFEASIBLE for %s: their bundles fit on no node the Ray cluster has or can autoscale to. Waiting will not help.' % c.rayPlacementGroupsInfeasibleFor
        + t.nextStep('pending_placement', 'ray_infeasible'),
      ),
    ],
    stages={ 'ray/ray-llm': 'pending_placement:ray_infeasible' },
    exprs=[
      t.expr('namespace_workload:gpuledger_workloads:group', { 'namespace_workload:gpuledger_workloads:group{namespace="ray",workload="ray-llm"}': 1 }),
    ],
  ),

  // Waiting for resources is not infeasible: only the waiting alert, after its own `for`.
  t.scenario(
    'Ray placement group waiting for resources',
    f.rayPlacementGroups('ray-llm', 'NO_RESOURCES', 2, namespace='ray')
    + f.rayPendingGpus('ray-llm', 'placement_group', 8, namespace='ray')
    + f.rayPendingGpus('ray-llm', 'actor', 1, namespace='ray'),
    fires=[
      t.alert(
        'GpuLedgerRayPlacementGroupsWaiting',
        { namespace: 'ray', workload: 'ray-llm', scheduling_state: 'NO_RESOURCES' },
        '2 Ray placement group(s) of workload ray/ray-llm have been waiting for resources (NO_RESOURCES) for %s: they would fit, but the Ray nodes that could hold them are busy.' % c.rayPlacementGroupsWaitingFor
        + t.nextStep('pending_placement', 'ray_no_resources'),
      ),
    ],
    stages={ 'ray/ray-llm': 'pending_placement:ray_no_resources' },
    exprs=[
      t.expr('namespace_workload_kind:gpuledger_ray_pending_gpus:sum', {
        'namespace_workload_kind:gpuledger_ray_pending_gpus:sum{kind="actor",namespace="ray",workload="ray-llm"}': 1,
        'namespace_workload_kind:gpuledger_ray_pending_gpus:sum{kind="placement_group",namespace="ray",workload="ray-llm"}': 8,
      }),
    ],
  ),

  // A namespace-less Ray workload nobody else names keeps its own stage series.
  t.scenario(
    'Ray work of a workload only the Ray cluster knows',
    f.rayPendingGpus('ray-batch', 'actor', 2),
    stages={ '/ray-batch': 'pending_placement:ray_no_resources' },
  ),
])
