// Paired scenarios: the same engines with and without a placement or startup problem.
// A placement problem never fires an engine or routing alert, and an engine problem
// never fires a placement alert: each scenario checks every alert of the mixin.
local e = import 'engine.libsonnet';
local f = import 'fixtures.libsonnet';
local t = import 'lib.libsonnet';
local c = t.config;

local pendingPod = f.pendingPod('chat-c', 'insufficient_gpu', 1);
local pendingAlert = t.alert(
  'GpuLedgerPodsPendingPlacement',
  { namespace: 'ml', workload: 'chat', reason: 'insufficient_gpu' },
  '1 GPU pod(s) of workload ml/chat have been pending placement for %s: no node that would take the pod has enough free GPUs (reason insufficient_gpu).' % c.podsPendingPlacementFor
  + t.nextStep('pending_placement', 'insufficient_gpu'),
);

// The same replica, its GPUs asked through a ResourceClaim no node can satisfy (DRA).
local claimPendingPod = f.pendingPod('chat-c', 'claim_unallocatable', 1);
local claimPendingAlert = t.alert(
  'GpuLedgerPodsPendingPlacement',
  { namespace: 'ml', workload: 'chat', reason: 'claim_unallocatable' },
  "1 GPU pod(s) of workload ml/chat have been pending placement for %s: no node has free devices that fit the pod's ResourceClaims (reason claim_unallocatable)." % c.podsPendingPlacementFor
  + t.nextStep('pending_placement', 'claim_unallocatable'),
);

// A third replica placed on a node, loading its model: GPU containers not ready, engine down.
local startingReplica = f.startingPod('chat-c') + f.engine('chat-c', up=0, gpus=['GPU-c']);
local startingAlert = t.alert(
  'GpuLedgerWorkloadStartingTooLong',
  { namespace: 'ml', workload: 'chat' },
  'Workload ml/chat has been starting for %s: its pods are placed on nodes, but GPU containers are not ready or vLLM engines do not answer.' % c.workloadStartingFor
  + t.nextStep('starting', 'pod_not_ready'),
);

local situations = [
  { name: 'KV-cache pressure', engines: e.kvPressureEngines, alerts: e.kvPressureAlerts, stage: 'engine_queueing:kv_cache' },
  { name: 'max_num_seqs bound', engines: e.maxNumSeqsEngines, alerts: e.maxNumSeqsAlerts, stage: 'engine_queueing:max_num_seqs' },
  { name: 'sticky routing', engines: e.stickyRoutingEngines, alerts: e.stickyRoutingAlerts, stage: 'routing:imbalance' },
];

t.file(std.flattenArrays([
  [
    t.scenario(
      '%s, nothing pending: only the engine-side alert' % s.name,
      s.engines,
      fires=s.alerts,
      stages={ 'ml/chat': s.stage },
    ),
    t.scenario(
      '%s while a replica is pending placement: only the placement alert' % s.name,
      s.engines + pendingPod,
      fires=[pendingAlert],
      stages={ 'ml/chat': 'pending_placement:insufficient_gpu' },
    ),
    t.scenario(
      '%s while a replica cannot allocate its DRA claims: only the placement alert' % s.name,
      s.engines + claimPendingPod,
      fires=[claimPendingAlert],
      stages={ 'ml/chat': 'pending_placement:claim_unallocatable' },
    ),
    t.scenario(
      '%s while a replica is starting: only the startup alert' % s.name,
      s.engines + startingReplica,
      fires=[startingAlert],
      stages={ 'ml/chat': 'starting:pod_not_ready' },
    ),
  ]
  for s in situations
] + [
  [
    // The reverse direction: a placement problem next to healthy engines.
    t.scenario(
      'pending placement next to healthy engines: only the placement alert',
      f.engine('chat-a', running=3, kv=0.3, gpus=['GPU-a']) + pendingPod,
      fires=[pendingAlert],
      stages={ 'ml/chat': 'pending_placement:insufficient_gpu' },
    ),
    // Ray waits for resources while the Ray workload's engines queue with a full cache.
    t.scenario(
      'Ray placement groups waiting while engines queue: only the Ray alert',
      f.rayPlacementGroups('chat', 'NO_RESOURCES', 1, namespace='ml')
      + f.rayPendingGpus('chat', 'placement_group', 2, namespace='ml')
      + e.kvPressureEngines,
      fires=[
        t.alert(
          'GpuLedgerRayPlacementGroupsWaiting',
          { namespace: 'ml', workload: 'chat', scheduling_state: 'NO_RESOURCES' },
          '1 Ray placement group(s) of workload ml/chat have been waiting for resources (NO_RESOURCES) for %s: they would fit, but the Ray nodes that could hold them are busy.' % c.rayPlacementGroupsWaitingFor
          + t.nextStep('pending_placement', 'ray_no_resources'),
        ),
      ],
      stages={ 'ml/chat': 'pending_placement:ray_no_resources' },
    ),
    // Pending placement outranks starting: one stage, one alert.
    t.scenario(
      'pending and starting replicas: only the placement alert',
      f.engine('chat-a', running=3, kv=0.3, gpus=['GPU-a']) + pendingPod + startingReplica,
      fires=[pendingAlert],
      stages={ 'ml/chat': 'pending_placement:insufficient_gpu' },
    ),
  ],
]))
