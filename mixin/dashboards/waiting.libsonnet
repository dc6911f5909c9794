// "Where is it waiting": per workload, the stage over time, and the placement, startup,
// engine and routing signals that decide it, on one shared time axis.
local g = import '../lib/dashboards.libsonnet';

{
  grafanaDashboards+:: {
    local c = $._config,
    // Recording rules carry no job label; W filters them by the variables.
    local W = g.selector(c, ['namespace=~"$namespace"', 'workload=~"$workload"'], raw=false),
    local R(m=[]) = g.selector(c, ['namespace=~"$namespace"', 'workload=~"$workload"'] + m),
    // Stages and codes: lib/stages.json (config.libsonnet's `_stages`).
    local stages = $._stages.stages,
    local stageColors = {
      pending_placement: 'red',
      starting: 'orange',
      routing: 'purple',
      engine_queueing: 'yellow',
      serving: 'green',
      idle: 'blue',
      no_engine: 'text',
    },
    assert std.set(std.objectFields(stageColors)) == std.set([s.stage for s in stages])
           : 'dashboards/waiting.libsonnet needs a color for every stage of stages.json',
    local stageText(stage) = std.strReplace(stage, '_', ' '),
    local stageStates = [[s.code, stageText(s.stage), stageColors[s.stage]] for s in stages],
    local precedence = std.join(' > ', [stageText(s.stage) for s in stages]),
    local stageStat(stage, title, color) = g.stat(
      title,
      'Workloads whose stage is %s now (namespace_workload_stage:gpuledger_stage_code:onehot).' % stage,
      'short',
      // The sum of the 0/1 series, not a count of the 1s: data for every stage while any
      // workload exists, none in this stage included.
      [g.target('sum(max by (namespace, workload) (namespace_workload_stage:gpuledger_stage_code:onehot%s)) or vector(0)' % g.selector(c, ['namespace=~"$namespace"', 'workload=~"$workload"', 'stage="%s"' % stage], raw=false))],
      [{ color: 'green', value: null }, { color: color, value: 1 }],
    ),

    'gpuledger-where-waiting.json': g.dashboard(
      c,
      'GPU Ledger / Where requests wait',
      c.dashboardUids.waiting,
      'Per workload: is it pending placement (Kubernetes or Ray cannot place it), starting, routing, engine queueing, serving, idle or without an engine, and the signals behind each stage.',
      [
        g.datasourceVariable,
        g.clusterVariable(c, 'gpuledger_build_info'),
        g.queryVariable('namespace', 'Namespace', 'label_values(namespace_workload:gpuledger_workloads:group%s, namespace)' % g.selector(c, [], raw=false)),
        g.queryVariable('workload', 'Workload', 'label_values(namespace_workload:gpuledger_workloads:group%s, workload)' % g.selector(c, ['namespace=~"$namespace"'], raw=false)),
      ],
      [
        {
          title: 'Stage',
          height: 8,
          panels: [
            g.stateTimeline(
              'Stage per workload',
              'One row per workload: the layer its requests wait in. Precedence: %s (namespace_workload:gpuledger_stage_code:max; the reason: namespace_workload_stage_reason:gpuledger_stage_reason_code:group).' % precedence,
              [g.target('max by (namespace, workload) (namespace_workload:gpuledger_stage_code:max%s)' % W, '{{namespace}}/{{workload}}')],
              stageStates,
            ),
            g.width(g.table(
              'Stage and reason now',
              'Per workload: its stage and why, the same verdict `gpuledger explain` gives (namespace_workload_stage_reason:gpuledger_stage_reason_code:group).',
              'short',
              [g.target('max by (namespace, workload, stage, reason) (namespace_workload_stage_reason:gpuledger_stage_reason_code:group%s)' % W)],
              [['namespace', 'Namespace'], ['workload', 'Workload'], ['stage', 'Stage'], ['reason', 'Reason']],
            ), 8),
          ],
        },
        {
          height: 4,
          panels: [
            stageStat(s.stage, std.asciiUpper(stageText(s.stage)[0]) + stageText(s.stage)[1:], stageColors[s.stage])
            for s in stages
          ],
        },
        {
          title: 'Pending placement: Kubernetes and Ray',
          height: 8,
          panels: [
            g.timeseries(
              'GPU pods pending placement, by reason',
              'Pods that request GPUs and that the scheduler has not placed, by the dominant reason of their PodScheduled=False condition.',
              'short',
              [g.target('sum by (namespace, workload, reason) (namespace_workload_reason:gpuledger_pod_pending_placement:sum%s)' % W, '{{namespace}}/{{workload}} {{reason}}')],
            ),
            g.timeseries(
              'GPUs pending placement',
              'GPUs asked by unplaced pods (Kubernetes) and by unplaced Ray placement groups and actors (Ray).',
              'short',
              [
                g.target('sum by (namespace, workload) (namespace_workload:gpuledger_pod_pending_gpus:sum%s)' % W, 'Kubernetes {{namespace}}/{{workload}}'),
                g.target('sum by (namespace, workload, kind) (namespace_workload_kind:gpuledger_ray_pending_gpus:sum%s)' % W, 'Ray {{kind}} {{namespace}}/{{workload}}'),
              ],
            ),
            g.timeseries(
              'Ray placement groups pending',
              'Pending Ray placement groups by scheduling state: NO_RESOURCES waits for busy resources, INFEASIBLE never fits.',
              'short',
              [g.target('sum by (namespace, workload, scheduling_state) (namespace_workload_scheduling_state:gpuledger_ray_placement_groups_pending:sum%s)' % W, '{{namespace}}/{{workload}} {{scheduling_state}}')],
            ),
          ],
        },
        {
          height: 7,
          panels: [
            g.table(
              'Pods pending placement now',
              'Every unplaced pod of the selected workloads: why, for how long, and how many GPUs it asks for.',
              'short',
              [
                g.target(|||
                  (time() - max by (namespace, workload, pod, pod_uid) (gpuledger_pod_pending_since_timestamp_seconds%s))
                  * on (pod_uid) group_left (reason)
                  max by (pod_uid, reason) (gpuledger_pod_pending_placement%s)
                ||| % [R(), R()]),
                g.target(|||
                  max by (namespace, workload, pod, pod_uid) (gpuledger_pod_pending_gpus%s)
                  * on (pod_uid) group_left (reason)
                  max by (pod_uid, reason) (gpuledger_pod_pending_placement%s)
                ||| % [R(), R()]),
              ],
              [['namespace', 'Namespace'], ['workload', 'Workload'], ['pod', 'Pod'], ['reason', 'Reason'], ['Value #A', 'Pending for'], ['Value #B', 'GPUs asked']],
              { 'Value #A': 's' },
            ),
          ],
        },
        {
          title: 'Starting',
          height: 7,
          panels: [
            g.timeseries(
              'Pods starting',
              'Pods placed on a node whose GPU containers are not Ready yet (model download and load).',
              'short',
              [g.target('sum by (namespace, workload) (namespace_workload:gpuledger_pod_starting:sum%s)' % W, '{{namespace}}/{{workload}}')],
            ),
            g.timeseries(
              'Engines up vs expected',
              'vLLM engines that answered their last scrape, against every engine gpuledger knows of. A gap means engines are still loading or are failing.',
              'short',
              [
                g.target('sum by (namespace, workload) (namespace_workload:gpuledger_engine_up:sum%s)' % W, 'up {{namespace}}/{{workload}}'),
                g.target('sum by (namespace, workload) (namespace_workload:gpuledger_engine_up:count%s)' % W, 'expected {{namespace}}/{{workload}}'),
              ],
            ),
          ],
        },
        {
          title: 'Engine queueing',
          height: 8,
          panels: [
            g.timeseries(
              'Requests waiting, by reason',
              'Requests waiting inside vLLM engines: capacity (no room in the batch: KV cache or max_num_seqs) or deferred (LoRA budget, KV transfer). Engines before vLLM 0.20 do not split by reason.',
              'short',
              [g.target('sum by (namespace, workload, reason) (namespace_workload_reason:gpuledger_engine_requests_waiting_by_reason:sum%s)' % W, '{{namespace}}/{{workload}} {{reason}}')],
              stack=true,
            ),
            g.timeseries(
              'Requests running and waiting',
              'Requests in the running batch and in the waiting queue, summed over the engines of each workload.',
              'short',
              [
                g.target('sum by (namespace, workload) (namespace_workload:gpuledger_engine_requests_running:sum%s)' % W, 'running {{namespace}}/{{workload}}'),
                g.target('sum by (namespace, workload) (namespace_workload:gpuledger_engine_requests_waiting:sum%s)' % W, 'waiting {{namespace}}/{{workload}}'),
              ],
            ),
            g.timeseries(
              'Max KV-cache usage',
              'The fullest engine of each workload. Dashed lines: the headroom and pressure thresholds of the alerts.',
              'percentunit',
              [g.target('max by (namespace, workload) (namespace_workload:gpuledger_engine_kv_cache_usage_ratio:max%s)' % W, '{{namespace}}/{{workload}}')],
              max=1,
              thresholds=[[c.kvCacheHeadroomRatio, 'yellow'], [c.kvCachePressureRatio, 'red']],
            ),
            g.timeseries(
              'Preemptions',
              'Requests preempted per second (KV cache ran out mid-generation; their work is recomputed), 5m rate.',
              'ops',
              [g.target('sum by (namespace, workload) (namespace_workload:gpuledger_engine_preemptions:rate5m%s)' % W, '{{namespace}}/{{workload}}')],
            ),
          ],
        },
        {
          title: 'Routing',
          height: 8,
          panels: [
            g.timeseries(
              'Engines queueing vs engines with headroom',
              'Engines with waiting requests, and engines that could take more now (nothing waits, KV cache below the headroom ratio, below max_num_seqs). Both at once is a routing imbalance.',
              'short',
              [
                g.target('sum by (namespace, workload) (namespace_workload:gpuledger_engine_queueing:sum%s)' % W, 'queueing {{namespace}}/{{workload}}'),
                g.target('sum by (namespace, workload) (namespace_workload:gpuledger_engine_headroom:sum%s)' % W, 'headroom {{namespace}}/{{workload}}'),
              ],
            ),
            g.timeseries(
              'Routing imbalance',
              'Engines that queue while a sibling engine of the same workload has headroom (namespace_workload:gpuledger_routing_imbalance:sum). Above 0: requests are not spread over the replicas.',
              'short',
              [g.target('sum by (namespace, workload) (namespace_workload:gpuledger_routing_imbalance:sum%s)' % W, '{{namespace}}/{{workload}}')],
            ),
            g.timeseries(
              'Requests waiting per engine',
              'Waiting requests of every engine (one scrape target, model and data-parallel rank): sticky routing shows as one line high while its siblings stay at 0.',
              'short',
              [g.target('sum by (node, namespace, pod, target, model_name, engine) (gpuledger_engine_requests%s)' % R(['state="waiting"']), '{{namespace}}/{{pod}} engine {{engine}} ({{target}})')],
            ),
          ],
        },
        {
          title: 'Routing: Ray Serve',
          height: 8,
          panels: [
            g.timeseries(
              'Serve: queued at the router vs running in replicas',
              'Requests a Ray Serve router (HTTP proxy, deployment handle) holds for a deployment, not assigned to a replica yet, and the requests its replicas run. A router queue while no engine of the workload queues is stage routing, reason serve_router_queue.',
              'short',
              [
                g.target('sum by (namespace, workload, application, deployment) (namespace_workload_application_deployment:gpuledger_serve_router_queued_requests:sum%s)' % W, 'router {{namespace}}/{{workload}} {{application}}/{{deployment}}'),
                g.target('sum by (namespace, workload, application, deployment) (gpuledger_serve_replica_ongoing_requests%s)' % R(), 'replicas {{namespace}}/{{workload}} {{application}}/{{deployment}}'),
              ],
            ),
            g.timeseries(
              'Serve: requests per replica',
              "Requests each Ray Serve replica runs now. Replicas at their deployment's max_ongoing_requests leave the rest at the router; idle replicas under a router queue are not reached.",
              'short',
              [g.target('sum by (namespace, pod, application, deployment, replica) (gpuledger_serve_replica_ongoing_requests%s)' % R(), '{{application}}/{{deployment}} {{replica}} ({{namespace}}/{{pod}})')],
            ),
          ],
        },
        {
          // InferencePools (the cluster view's) beside the engines of their member pods
          // (the node agents'), joined on pod_uid.
          title: 'Routing: gateway (InferencePools)',
          height: 8,
          panels: [
            g.timeseries(
              'Gateway: held by the picker vs waiting in its engines',
              "Requests each InferencePool's endpoint picker holds in its flow-control queue (gpuledger_gateway_queued_requests), and the requests waiting in the engines of the pool's member pods. Held by the picker while the engines have headroom: stage routing, reason gateway_queue (GpuLedgerGatewayQueueing). Waiting in the engines while the picker passes through: engine queueing.",
              'short',
              [
                g.target('sum by (namespace, pool) (gpuledger_gateway_queued_requests%s)' % g.selector(c, ['namespace=~"$namespace"']), 'picker {{namespace}}/{{pool}}'),
                g.target('sum by (namespace, pool) (sum by (%(cl)s, namespace, pod_uid) (gpuledger_engine_requests%(waiting)s) * on (%(cl)s, namespace, pod_uid) group_left (pool) group by (%(cl)s, namespace, pod_uid, pool) (gpuledger_inference_pool_member%(members)s))' % { cl: c.clusterLabel, waiting: R(['state="waiting"']), members: R() }, 'engines {{namespace}}/{{pool}}'),
              ],
            ),
            g.timeseries(
              "Gateway: ready endpoints, the picker's and Kubernetes'",
              "Endpoints the picker counts ready (metrics fresh enough to pick them: gpuledger_gateway_picker_ready_endpoints) against the pool's Ready member pods (gpuledger_inference_pool_member). The picker below Kubernetes: it cannot read some engines' metrics. Both 0: GpuLedgerInferencePoolNoReadyEndpoints.",
              'short',
              [
                g.target('sum by (namespace, pool) (gpuledger_gateway_picker_ready_endpoints%s)' % g.selector(c, ['namespace=~"$namespace"']), 'picker {{namespace}}/{{pool}}'),
                g.target('sum by (namespace, pool) (gpuledger_inference_pool_member%s)' % g.selector(c, ['namespace=~"$namespace"']), 'Ready pods {{namespace}}/{{pool}}'),
              ],
            ),
            g.timeseries(
              'Gateway: pool saturation',
              "How full each pool's picker judges it (flow control's saturation; at 1 and above it holds new requests). Absent where flow control is off.",
              'percentunit',
              [g.target('max by (namespace, pool) (gpuledger_gateway_pool_saturation%s)' % g.selector(c, ['namespace=~"$namespace"']), '{{namespace}}/{{pool}}')],
            ),
          ],
        },
        {
          // An engine on the Ray executor holds GPUs on other nodes' pods: its node agent
          // alone cannot count them; the footprint rule joins every agent's workers.
          title: 'Engines on the Ray executor: footprint across nodes',
          height: 8,
          panels: [
            g.table(
              'GPUs in use across nodes vs configured',
              "Per engine on the Ray executor: GPUs its Ray workers' processes hold on every node (node_namespace_workload_pod_target_engine:gpuledger_ray_worker_gpus:count; empty while a worker's node agent is not reported) against tensor_parallel_size x pipeline_parallel_size. Unequal for 15 minutes: GpuLedgerEngineParallelismMismatch.",
              'short',
              [
                g.target('max by (node, namespace, workload, pod, target, model_name, engine) (node_namespace_workload_pod_target_engine:gpuledger_ray_worker_gpus:count%s)' % W),
                g.target('max by (node, namespace, workload, pod, target, model_name, engine) (gpuledger_engine_gpus%s and on (node, pod_uid, target, engine) gpuledger_engine_ray_job_info)' % R(['state="configured"'])),
              ],
              [
                ['namespace', 'Namespace'],
                ['workload', 'Workload'],
                ['pod', 'Engine pod'],
                ['node', 'Node'],
                ['model_name', 'Model'],
                ['engine', 'Engine'],
                ['Value #A', 'GPUs in use (all nodes)'],
                ['Value #B', 'GPUs configured'],
              ],
            ),
            g.table(
              'Ray workers: rank, pod, node and GPU memory',
              "Each vLLM Ray worker (TP/PP rank) of the engines in view, the pod and node it runs on and the GPU memory its process holds per GPU. Workers are found by their engine's Ray job (ray_job_id, ray_driver_node_id), the same on every node.",
              'bytes',
              [
                g.target('max by (node, namespace, pod, ray_job_id, ray_driver_node_id, tp_rank, pp_rank, gpu_uuid) (gpuledger_ray_worker_gpu_memory_used_bytes%s and on (ray_job_id, ray_driver_node_id) group by (ray_job_id, ray_driver_node_id) (gpuledger_engine_ray_job_info%s))' % [g.selector(c, []), R()]),
              ],
              [
                ['ray_job_id', 'Ray job'],
                ['tp_rank', 'TP rank'],
                ['pp_rank', 'PP rank'],
                ['namespace', 'Namespace'],
                ['pod', 'Worker pod'],
                ['node', 'Node'],
                ['gpu_uuid', 'GPU UUID'],
                ['Value', 'GPU memory'],
              ],
              { Value: 'bytes' },
            ),
          ],
        },
      ],
    ),
  },
}
