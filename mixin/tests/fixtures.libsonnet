// Series as the gpuledger exporters expose them, for the promtool scenarios.
// Node-mode series carry the DaemonSet pod's job/instance and `node`; cluster-mode series
// (pending pods, Ray placement groups and pending GPUs) the Deployment's.
local t = import 'lib.libsonnet';

local nodeExporter = t.nodeTarget { node: 'gpu-node-1' };
local clusterExporter = t.clusterTarget { node: 'control-1' };

{
  nodeExporter:: nodeExporter,
  clusterExporter:: clusterExporter,

  // The labels that identify an engine on alerts (no job/instance: rules aggregate them away):
  // one scrape target, model and data-parallel rank. target=null: the pod's <pod>:8000.
  engineKey(pod, namespace='ml', workload='chat', engine='0', model='llama-3-8b', target=null):: {
    node: nodeExporter.node,
    namespace: namespace,
    workload: workload,
    pod: pod,
    pod_uid: 'uid-' + pod,
    model_name: model,
    target: if target == null then pod + ':8000' else target,
    engine: engine,
  },

  // One vLLM engine (a data-parallel rank `engine` of the API server in `pod`, scraped at
  // `target`: <pod>:8000 unless given).
  // gpus: GPU UUIDs its processes hold (gpuledger_engine_gpu_info, gpus{state="in_use"});
  // maxNumSeqs=null: --max-num-seqs not set. deferred: how many of the waiting requests the
  // engine defers (waiting_by_reason); the others wait for capacity.
  engine(pod,
         namespace='ml',
         workload='chat',
         engine='0',
         model='llama-3-8b',
         up=1,
         waiting=0,
         running=0,
         kv=0.3,
         maxNumSeqs=8,
         tp=1,
         pp=1,
         gpus=[],
         preemptionsPerMinute=0,
         deferred=0,
         target=null,
         kind='vllm')::
    // kind: the engine kind (engine_kind on config_info). SGLang has no waiting-by-reason
    // series, and its --max-running-requests is max_num_seqs.
    local key = nodeExporter + $.engineKey(pod, namespace, workload, engine, model, target);
    [
      t.gauge('gpuledger_engine_up', key, up),
      t.gauge('gpuledger_engine_config_info', key {
        tensor_parallel_size: std.toString(tp),
        pipeline_parallel_size: std.toString(pp),
        data_parallel_size: '1',
        max_num_seqs: if maxNumSeqs == null then '' else std.toString(maxNumSeqs),
        block_size: if kind == 'vllm' then '16' else '',
        num_gpu_blocks: if kind == 'vllm' then '4096' else '',
        engine_kind: kind,
      }, 1),
      t.gauge('gpuledger_engine_gpus', key { state: 'configured' }, tp * pp),
    ]
    + (if maxNumSeqs == null then [] else [t.gauge('gpuledger_engine_max_num_seqs', key, maxNumSeqs)])
    + (if gpus == [] then [] else [t.gauge('gpuledger_engine_gpus', key { state: 'in_use' }, std.length(gpus))])
    + [
      t.gauge('gpuledger_engine_gpu_info', key { gpu_uuid: gpus[i], role: if std.length(gpus) == 1 then 'engine_core' else 'worker', rank: std.toString(i) }, 1)
      for i in std.range(0, std.length(gpus) - 1)
    ]
    + (if up == 1 then [
         t.gauge('gpuledger_engine_requests', key { state: 'waiting' }, waiting),
         t.gauge('gpuledger_engine_requests', key { state: 'running' }, running),
       ] + (if kind == 'vllm' then [
              t.gauge('gpuledger_engine_requests_waiting_by_reason', key { reason: 'capacity' }, waiting - deferred),
              t.gauge('gpuledger_engine_requests_waiting_by_reason', key { reason: 'deferred' }, deferred),
            ] else []) + [
         t.gauge('gpuledger_engine_kv_cache_usage_ratio', key, kv),
         t.counter('gpuledger_engine_preemptions_total', key, preemptionsPerMinute),
       ] else []),

  // A pod the scheduler has not placed (cluster-mode exporter).
  pendingPod(pod, reason, gpus, namespace='ml', workload='chat')::
    local key = clusterExporter { namespace: namespace, pod: pod, pod_uid: 'uid-' + pod, workload: workload };
    [
      t.gauge('gpuledger_pod_pending_placement', key { reason: reason }, 1),
      t.gauge('gpuledger_pod_pending_gpus', key, gpus),
      t.gauge('gpuledger_pod_pending_since_timestamp_seconds', key, 0),
    ],

  // A pod placed on the node whose GPU containers are not Ready yet.
  startingPod(pod, namespace='ml', workload='chat')::
    [t.gauge('gpuledger_pod_starting', nodeExporter { namespace: namespace, pod: pod, pod_uid: 'uid-' + pod, workload: workload }, 1)],

  // Kubernetes allocated these GPUs to the pod's container.
  allocation(pod, gpus, namespace='ml', container='vllm')::
    [
      t.gauge('gpuledger_gpu_allocation_info', nodeExporter {
        namespace: namespace,
        pod: pod,
        pod_uid: 'uid-' + pod,
        container: container,
        gpu_uuid: g,
        resource: 'nvidia.com/gpu',
      }, 1)
      for g in gpus
    ],

  // Kubernetes allocated this GPU to the pod's container through a DRA ResourceClaim: the
  // allocation's resource is the driver, and gpuledger_dra_allocation_info names the claim.
  draAllocation(pod, gpu, claim, device, namespace='ml', container='main')::
    local key = nodeExporter { namespace: namespace, pod: pod, pod_uid: 'uid-' + pod, container: container, gpu_uuid: gpu };
    [
      t.gauge('gpuledger_gpu_allocation_info', key { resource: 'gpu.nvidia.com' }, 1),
      t.gauge('gpuledger_dra_allocation_info', key {
        dra_claim_namespace: namespace,
        dra_claim_name: claim,
        dra_driver_name: 'gpu.nvidia.com',
        dra_pool_name: nodeExporter.node,
        dra_device_name: device,
        dra_share_id: '',
      }, 1),
    ],

  // gpuledger_gpu_allocated_unused / gpuledger_gpu_unallocated_use of one container and GPU.
  ledgerFlag(metric, pod, gpu, value=1, namespace='ml', workload='chat', container='vllm')::
    [t.gauge(metric, nodeExporter {
      namespace: namespace,
      pod: pod,
      pod_uid: 'uid-' + pod,
      container: container,
      workload: workload,
      gpu_uuid: gpu,
    }, value)],

  // gpuledger_source_up and the state set gpuledger_source_state of the node exporter.
  // down: sources whose fetches fail (their error counter grows); disabled: sources not
  // configured (source_up 0 as well, state="not_configured", no errors). state=false: an
  // exporter from before gpuledger_source_state (source_up only).
  sources(down=[], disabled=[], state=true)::
    local all = ['nvml', 'procfs', 'podresources', 'kubernetes', 'vllm', 'ray'];
    local stateOf(s) = if std.member(down, s) then 'down' else if std.member(disabled, s) then 'not_configured' else 'up';
    [
      t.gauge('gpuledger_source_up', nodeExporter { source: s }, if stateOf(s) == 'up' then 1 else 0)
      for s in all
    ]
    + (if !state then [] else [
         t.gauge('gpuledger_source_state', nodeExporter { source: s, state: x }, if stateOf(s) == x then 1 else 0)
         for s in all
         for x in ['up', 'down', 'not_configured']
       ])
    + [t.counter('gpuledger_source_errors_total', nodeExporter { source: s, reason: 'timeout' }, 6, start=1) for s in down],

  // A Ray node that is a pod on this node: Ray's logical GPUs, and the GPUs Kubernetes
  // allocated to the pod (allocated=null: unknown, PodResources not read).
  rayNode(pod, rayNodeId, total, available, allocated=null, namespace='ray')::
    local key = nodeExporter { namespace: namespace, pod: pod, pod_uid: 'uid-' + pod, ray_node_id: rayNodeId };
    [
      t.gauge('gpuledger_ray_node_gpus', key { state: 'total' }, total),
      t.gauge('gpuledger_ray_node_gpus', key { state: 'available' }, available),
    ]
    + (if allocated == null then [] else [t.gauge('gpuledger_ray_node_gpus', key { state: 'allocated' }, allocated)]),

  // Cluster-mode Ray series; namespace=null: the exporter does not know it.
  local rayKey(workload, namespace) =
    clusterExporter { workload: workload } + (if namespace == null then {} else { namespace: namespace }),
  rayPlacementGroups(workload, schedulingState, count, namespace=null)::
    [t.gauge('gpuledger_ray_placement_groups', rayKey(workload, namespace) { state: 'PENDING', scheduling_state: schedulingState }, count)],
  rayPendingGpus(workload, kind, gpus, namespace=null)::
    [t.gauge('gpuledger_ray_pending_gpus', rayKey(workload, namespace) { kind: kind }, gpus)],

  // A Ray Serve deployment on the node: what its router (the node's proxy) holds, and its
  // replicas as [pod, replica id, requests it runs].
  serveDeployment(application, deployment, queued, atReplicas=0, replicas=[], namespace='ray', workload='ray-llm', maxOngoing=5)::
    local key = nodeExporter { namespace: namespace, workload: workload, application: application, deployment: deployment };
    [
      t.gauge('gpuledger_serve_deployment_info', key { status: 'HEALTHY', max_ongoing_requests: std.toString(maxOngoing) }, 1),
      t.gauge('gpuledger_serve_router_queued_requests', key, queued),
      t.gauge('gpuledger_serve_router_requests_at_replicas', key, atReplicas),
    ]
    + std.flattenArrays([
      local replica = nodeExporter { namespace: namespace, pod: r[0], pod_uid: 'uid-' + r[0], workload: workload, application: application, deployment: deployment, replica: r[1] };
      [
        t.gauge('gpuledger_serve_replica_info', replica { state: 'RUNNING' }, 1),
        t.gauge('gpuledger_serve_replica_ongoing_requests', replica, r[2]),
      ]
      for r in replicas
    ]),

  // An InferencePool as the cluster view exposes it: its members as [pod, workload, ready]
  // (pod_uid uid-<pod>, as engine() gives its pod), and its endpoint picker's reading
  // (queued=null: flow control off; pickerUp=0: the picker not read).
  inferencePool(pool, members=[], namespace='ml', queued=null, ready=null, saturation=null, pickerUp=1)::
    local key = clusterExporter { namespace: namespace, pool: pool };
    [
      t.gauge('gpuledger_inference_pool_info', key { pool_uid: 'uid-' + pool, picker_service: pool + '-epp', failure_mode: 'FailClose' }, 1),
      t.gauge('gpuledger_gateway_picker_up', key, pickerUp),
    ]
    + [
      t.gauge('gpuledger_inference_pool_member', key { pod: m[0], pod_uid: 'uid-' + m[0], workload: m[1] }, if m[2] then 1 else 0)
      for m in members
    ]
    + (if pickerUp == 1 && queued != null then [t.gauge('gpuledger_gateway_queued_requests', key, queued)] else [])
    + (if pickerUp == 1 && ready != null then [t.gauge('gpuledger_gateway_picker_ready_endpoints', key, ready)] else [])
    + (if pickerUp == 1 && saturation != null then [t.gauge('gpuledger_gateway_pool_saturation', key, saturation)] else []),
}
