// Recording rules, named `level:metric:operations` as in the kubernetes-mixin:
//   level       the labels the result keeps, `cluster` left implicit: namespace_workload
//               (+ _reason, _kind, _scheduling_state, _stage, _stage_reason,
//               _application_deployment for the extra labels),
//               node_namespace_workload_pod_target_engine (an engine; pod_uid and
//               model_name ride along), node_namespace_pod (a pod; pod_uid rides along);
//   metric      the gpuledger_* metric aggregated, with the value of a fixed selector
//               appended (`gpuledger_engine_requests{state="waiting"}` ->
//               gpuledger_engine_requests_waiting), or, for a derived quantity no raw
//               metric has (a 0/1 condition, a stage code), its gpuledger_* name;
//   operations  the aggregation: sum, max, count, group, rate5m (a summed 5m rate), onehot.
// docs/mixin.md ("Recording rule names") has the table of the names before this
// convention, which rules/aliases.libsonnet still records for one release.
//
// Workload identity is (cluster, namespace, workload). Engine identity adds node, pod,
// pod_uid, model_name, target (the scraped host:port[/path]) and engine (the vLLM
// data-parallel rank): one scrape target, model and DP rank (docs/design.md, identity
// rule 6), so two targets of one pod, or of no pod, stay two engines. Ray series from the
// cluster-mode exporter may lack `namespace`: they aggregate to a key without it, and
// the stage broadcasts them to every namespace that has a workload of that name.
//
// One group, in dependency order: Prometheus evaluates the rules of a group one after
// the other at the same timestamp, so each rule sees the ones above it fresh.
{
  local c = $._config,
  local sel = c.gpuledgerSelector,
  local cl = c.clusterLabel,
  local wkey = '%s, namespace, workload' % cl,
  local ekey = '%s, node, namespace, workload, pod, pod_uid, model_name, target, engine' % cl,
  local pkey = '%s, node, namespace, pod, pod_uid' % cl,

  // Series that name a workload and always carry its namespace: the workloads that
  // `gpuledger explain` gives a verdict (exporter/gpuledger/explain/chain.py, Fleet).
  local namespacedWorkloadSeries = [
    'gpuledger_pod_pending_placement{%s, workload!=""}' % sel,
    'gpuledger_pod_starting{%s, workload!=""}' % sel,
    'gpuledger_engine_up{%s, workload!=""}' % sel,
    // A container using a GPU it is not allocated: a GPU workload, even without a request.
    'gpuledger_gpu_unallocated_use{%s, workload!=""} == 1' % sel,
    'gpuledger_ray_actor_gpus{%s, workload!=""}' % sel,
    'gpuledger_ray_pending_gpus{%s, workload!="", namespace!=""}' % sel,
    'gpuledger_ray_placement_groups{%s, workload!="", namespace!=""}' % sel,
    // Ray Serve deployments with a router or a replica on a node (outside Kubernetes the
    // exporter names them by --ray-workload).
    'gpuledger_serve_deployment_info{%s, workload!=""}' % sel,
    // Pods an InferencePool selects (the cluster view's): the gateway routes to them.
    'gpuledger_inference_pool_member{%s, workload!=""}' % sel,
  ],
  // Cluster-mode Ray series that may not know the namespace of their RayCluster.
  local namespacelessWorkloadSeries = [
    'gpuledger_ray_pending_gpus{%s, workload!="", namespace=""}' % sel,
    'gpuledger_ray_placement_groups{%s, workload!="", namespace=""}' % sel,
  ],
  // Indents every line of s by n spaces (for text inserted into a multi-line expr).
  local indent(s, n) = std.join('\n', [
    if l == '' then l else std.repeat(' ', n) + l
    for l in std.split(std.rstripChars(s, '\n'), '\n')
  ]),
  local union(series) = std.join('\nor\n', series),

  // ------------------------------------------------------------------ stages
  // Stages, their precedence and reasons: lib/stages.json (through
  // config.libsonnet's `_stages`), the file `gpuledger explain` judges by too.
  local model = $._stages,
  local stageOf(name) = [s for s in model.stages if s.stage == name][0],
  // Within a stage the first reason of stages.json is the strongest: highest rank.
  local rank(stage, reason) =
    local reasons = stageOf(stage).reasons;
    std.length(reasons) - std.find(reason, reasons)[0],
  // One number orders every (stage, reason): stage code * 100 + reason rank, so one `max`
  // picks the stage by precedence and, within it, the strongest reason.
  local code(stage, reason) =
    stageOf(stage).code * 100 + (if reason == null then 0 else rank(stage, reason)),

  // Ray's pending-placement reasons; every other reason of pending_placement is the
  // `reason` label of gpuledger_pod_pending_placement (`other` also takes labels
  // stages.json does not name).
  local rayReasons = ['ray_infeasible', 'ray_no_resources'],
  local podReasons = [r for r in stageOf('pending_placement').reasons if !std.member(rayReasons, r)],
  local podReasonSelector(r) =
    if r == 'other'
    then '{reason!~"%s"}' % std.join('|', [x for x in podReasons if x != 'other'])
    else '{reason="%s"}' % r,
  // Ray conditions for a key: namespaced, or namespace-less (joined on the name only).
  local rayPending(key, ns) =
    'sum by (%s) (namespace_workload_kind:gpuledger_ray_pending_gpus:sum%s) > 0' % [key, ns],
  local rayInfeasible(key, ns) =
    'sum by (%s) (namespace_workload_scheduling_state:gpuledger_ray_placement_groups_pending:sum{%sscheduling_state="INFEASIBLE"}) > 0'
    % [key, if ns == '' then '' else 'namespace="", '],
  local rayKeys = [[wkey, ''], ['%s, workload' % cl, '{namespace=""}']],
  local rayCondition(reason, key, ns) =
    if reason == 'ray_infeasible'
    then '%s\nand on (%s)\n%s' % [rayPending(key, ns), key, rayInfeasible(key, ns)]
    else '%s\nunless on (%s)\n%s' % [rayPending(key, ns), key, rayInfeasible(key, ns)],

  // At least queueingMinWaitingRequests held by the workload's pools' pickers while no
  // engine of the workload queues (explain/verdict.py's _gateway_holds).
  local gatewayHolds = std.rstripChars(|||
    (namespace_workload:gpuledger_gateway_queued_requests:sum >= %(min)g)
    unless on (%(wkey)s)
    (namespace_workload:gpuledger_engine_queueing:sum > 0)
  ||| % { wkey: wkey, min: c.queueingMinWaitingRequests }, '\n'),

  // Each stage's conditions: [reason, condition, the labels it joins the workload on].
  // These are the conditions gpuledger/explain/verdict.py checks on the ledger.
  local conditions = {
    pending_placement: [
      if std.member(rayReasons, r) then [r, rayCondition(r, k[0], k[1]), k[0]]
      else [r, 'sum by (%s) (namespace_workload_reason:gpuledger_pod_pending_placement:sum%s) > 0' % [wkey, podReasonSelector(r)], wkey]
      for r in stageOf('pending_placement').reasons
      for k in (if std.member(rayReasons, r) then rayKeys else [rayKeys[0]])
    ],
    starting: [
      ['pod_not_ready', 'namespace_workload:gpuledger_pod_starting:sum > 0', wkey],
      ['engine_not_up', 'namespace_workload:gpuledger_engine_up:sum < namespace_workload:gpuledger_engine_up:count', wkey],
    ],
    routing: [
      // The workload's pools' endpoint pickers hold requests while no engine of it
      // queues: with an engine that has headroom (the gateway holds them back), or with
      // every engine that is up full (flow control keeps the overflow at the gateway).
      ['gateway_queue', |||
        %(gatewayHolds)s
        and on (%(wkey)s)
        (namespace_workload:gpuledger_engine_headroom:sum > 0)
      ||| % { wkey: wkey, gatewayHolds: gatewayHolds }, wkey],
      ['gateway_saturated', |||
        %(gatewayHolds)s
        and on (%(wkey)s)
        (namespace_workload:gpuledger_engine_headroom:sum == 0)
      ||| % { wkey: wkey, gatewayHolds: gatewayHolds }, wkey],
      // Requests held by a Ray Serve router while no engine of the workload queues.
      ['serve_router_queue', |||
        max by (%(wkey)s) (namespace_workload_application_deployment:gpuledger_serve_router_queued_requests:sum >= %(min)g)
        unless on (%(wkey)s)
        (namespace_workload:gpuledger_engine_queueing:sum > 0)
      ||| % { wkey: wkey, min: c.queueingMinWaitingRequests }, wkey],
      ['imbalance', 'namespace_workload:gpuledger_routing_imbalance:sum > 0', wkey],
    ],
    engine_queueing: [
      [r, 'max by (%s) (node_namespace_workload_pod_target_engine:gpuledger_engine_queue_reason_rank:max) == %d' % [wkey, rank('engine_queueing', r)], wkey]
      for r in stageOf('engine_queueing').reasons
    ],
    serving: [[null, 'namespace_workload:gpuledger_engine_requests_running:sum > 0', wkey]],
    idle: [[null, 'namespace_workload:gpuledger_engine_up:count > 0', wkey]],
    no_engine: [[null, null, wkey]],  // every workload: the last stage always holds
  },
  assert std.set(std.objectFields(conditions)) == std.set([s.stage for s in model.stages])
         : 'rules/rules.libsonnet has conditions for other stages than stages.json',
  assert [s.code for s in model.stages] == std.reverse(std.set([s.code for s in model.stages]))
         : 'stage codes must be distinct and decrease in the order of stages (their precedence)',
  assert [s for s in model.stages if std.length(s.reasons) >= 100] == [] : 'a reason rank must fit in two digits',
  assert [s for s in model.stages if s.reasons != [] && std.set([c[0] for c in conditions[s.stage]]) != std.set(s.reasons)] == []
         : 'every reason of stages.json needs a condition in rules/rules.libsonnet',
  // Every condition, strongest first: `or` keeps the first one present per workload.
  local candidates = [
    if c[1] == null then '%d * namespace_workload:gpuledger_workloads:group' % code(s.stage, c[0])
    else '%d * (\n  namespace_workload:gpuledger_workloads:group\n  and on (%s)\n  (\n%s\n  )\n)' % [code(s.stage, c[0]), c[2], indent(c[1], 4)]
    for s in model.stages
    for c in std.sort(conditions[s.stage], function(c) if c[0] == null then 0 else -rank(s.stage, c[0]))
  ],

  // Per queueing engine: why it queues, as the rank of the engine_queueing reason.
  local engineReasonCondition = {
    kv_cache: 'max by (%s) (gpuledger_engine_kv_cache_usage_ratio{%s}) >= %g' % [ekey, sel, c.kvCachePressureRatio],
    deferred: |||
      max by (%(ekey)s) (gpuledger_engine_requests_waiting_by_reason{%(sel)s, reason="deferred"}) > 0
      unless on (%(ekey)s)
      max by (%(ekey)s) (gpuledger_engine_requests_waiting_by_reason{%(sel)s, reason="capacity"}) > 0
    ||| % { ekey: ekey, sel: sel },
    max_num_seqs: |||
      node_namespace_workload_pod_target_engine:gpuledger_engine_at_max_num_seqs:max == 1
      and on (%(ekey)s)
      max by (%(ekey)s) (gpuledger_engine_kv_cache_usage_ratio{%(sel)s}) < %(headroom)g
    ||| % { ekey: ekey, sel: sel, headroom: c.kvCacheHeadroomRatio },
    other: null,
  },
  assert std.set(std.objectFields(engineReasonCondition)) == std.set(stageOf('engine_queueing').reasons)
         : 'every engine_queueing reason of stages.json needs a condition in rules/rules.libsonnet',

  prometheusRules+:: {
    groups+: [
      {
        name: 'gpuledger.rules',
        rules: [
          // ------------------------------------------------------------ workloads
          // First in the group, from raw series only: Prometheus evaluates a group's rules
          // one after another against the live head, so a scrape landing mid-group, were
          // this rule later, could name a new workload the aggregates before it missed (a
          // one-evaluation no_engine, seen in CI). First, every aggregate after it is as new.
          // Every workload any layer knows. A namespace-less Ray key is kept only while no
          // namespaced series names a workload of that name.
          {
            record: 'namespace_workload:gpuledger_workloads:group',
            expr: |||
              group by (%(wkey)s) (
              %(namespaced2)s
              )
              or
              (
                group by (%(wkey)s) (
              %(namespaceless4)s
                )
                unless on (%(cl)s, workload)
                group by (%(wkey)s) (
              %(namespaced4)s
                )
              )
            ||| % {
              wkey: wkey,
              cl: cl,
              namespaced2: indent(union(namespacedWorkloadSeries), 2),
              namespaced4: indent(union(namespacedWorkloadSeries), 4),
              namespaceless4: indent(union(namespacelessWorkloadSeries), 4),
            },
          },
          // ------------------------------------------------------------ placement
          {
            record: 'namespace_workload_reason:gpuledger_pod_pending_placement:sum',
            expr: |||
              sum by (%(wkey)s, reason) (
                gpuledger_pod_pending_placement{%(sel)s}
                and on (%(cl)s, pod_uid)
                (gpuledger_pod_pending_gpus{%(sel)s} > 0)
              )
            ||| % { wkey: wkey, sel: sel, cl: cl },
          },
          {
            record: 'namespace_workload:gpuledger_pod_pending_gpus:sum',
            expr: |||
              sum by (%(wkey)s) (gpuledger_pod_pending_gpus{%(sel)s})
            ||| % { wkey: wkey, sel: sel },
          },
          {
            record: 'namespace_workload_kind:gpuledger_ray_pending_gpus:sum',
            expr: |||
              sum by (%(wkey)s, kind) (gpuledger_ray_pending_gpus{%(sel)s})
            ||| % { wkey: wkey, sel: sel },
          },
          {
            record: 'namespace_workload_scheduling_state:gpuledger_ray_placement_groups_pending:sum',
            expr: |||
              sum by (%(wkey)s, scheduling_state) (gpuledger_ray_placement_groups{%(sel)s, state="PENDING"})
            ||| % { wkey: wkey, sel: sel },
          },
          // ------------------------------------------------------------ startup
          {
            record: 'namespace_workload:gpuledger_pod_starting:sum',
            expr: |||
              sum by (%(wkey)s) (gpuledger_pod_starting{%(sel)s})
            ||| % { wkey: wkey, sel: sel },
          },
          {
            record: 'namespace_workload:gpuledger_engine_up:sum',
            expr: |||
              sum by (%(wkey)s) (gpuledger_engine_up{%(sel)s})
            ||| % { wkey: wkey, sel: sel },
          },
          {
            record: 'namespace_workload:gpuledger_engine_up:count',
            expr: |||
              count by (%(wkey)s) (gpuledger_engine_up{%(sel)s})
            ||| % { wkey: wkey, sel: sel },
          },
          // ------------------------------------------------------------ engines
          {
            record: 'namespace_workload:gpuledger_engine_requests_waiting:sum',
            expr: |||
              sum by (%(wkey)s) (gpuledger_engine_requests{%(sel)s, state="waiting"})
            ||| % { wkey: wkey, sel: sel },
          },
          {
            record: 'namespace_workload:gpuledger_engine_requests_running:sum',
            expr: |||
              sum by (%(wkey)s) (gpuledger_engine_requests{%(sel)s, state="running"})
            ||| % { wkey: wkey, sel: sel },
          },
          {
            record: 'namespace_workload_reason:gpuledger_engine_requests_waiting_by_reason:sum',
            expr: |||
              sum by (%(wkey)s, reason) (gpuledger_engine_requests_waiting_by_reason{%(sel)s})
            ||| % { wkey: wkey, sel: sel },
          },
          {
            record: 'namespace_workload:gpuledger_engine_kv_cache_usage_ratio:max',
            expr: |||
              max by (%(wkey)s) (gpuledger_engine_kv_cache_usage_ratio{%(sel)s})
            ||| % { wkey: wkey, sel: sel },
          },
          {
            record: 'namespace_workload:gpuledger_engine_preemptions:rate5m',
            expr: |||
              sum by (%(wkey)s) (rate(gpuledger_engine_preemptions_total{%(sel)s}[5m]))
            ||| % { wkey: wkey, sel: sel },
          },
          // Per engine, 0/1 for every engine that is up: requests wait in it.
          {
            record: 'node_namespace_workload_pod_target_engine:gpuledger_engine_queueing:max',
            expr: |||
              max by (%(ekey)s) (
                gpuledger_engine_requests{%(sel)s, state="waiting"} >= bool %(minWaiting)d
              )
              and on (%(ekey)s)
              (max by (%(ekey)s) (gpuledger_engine_up{%(sel)s}) == 1)
            ||| % { ekey: ekey, sel: sel, minWaiting: c.queueingMinWaitingRequests },
          },
          // Per engine, 0/1: it runs max_num_seqs requests (vLLM never runs more), the
          // batch cannot grow. 0 where --max-num-seqs is not set (the exporter does not
          // guess vLLM's version- and hardware-dependent default).
          {
            record: 'node_namespace_workload_pod_target_engine:gpuledger_engine_at_max_num_seqs:max',
            expr: |||
              max by (%(ekey)s) (gpuledger_engine_requests{%(sel)s, state="running"})
              >= bool on (%(ekey)s)
              max by (%(ekey)s) (gpuledger_engine_max_num_seqs{%(sel)s})
              or
              max by (%(ekey)s) (gpuledger_engine_requests{%(sel)s, state="running"}) * 0
            ||| % { ekey: ekey, sel: sel },
          },
          // Per engine, 0/1 for every engine that is up: it could take more requests now
          // (nothing waits, KV cache below the headroom ratio, below max_num_seqs).
          {
            record: 'node_namespace_workload_pod_target_engine:gpuledger_engine_headroom:max',
            expr: |||
              (
                node_namespace_workload_pod_target_engine:gpuledger_engine_queueing:max == 0
                and on (%(ekey)s)
                (max by (%(ekey)s) (gpuledger_engine_kv_cache_usage_ratio{%(sel)s}) < %(headroom)g)
                unless on (%(ekey)s)
                (node_namespace_workload_pod_target_engine:gpuledger_engine_at_max_num_seqs:max == 1)
              ) * 0 + 1
              or
              node_namespace_workload_pod_target_engine:gpuledger_engine_queueing:max * 0
            ||| % { ekey: ekey, sel: sel, headroom: c.kvCacheHeadroomRatio },
          },
          {
            record: 'namespace_workload:gpuledger_engine_queueing:sum',
            expr: |||
              sum by (%(wkey)s) (node_namespace_workload_pod_target_engine:gpuledger_engine_queueing:max)
            ||| % { wkey: wkey },
          },
          {
            record: 'namespace_workload:gpuledger_engine_headroom:sum',
            expr: |||
              sum by (%(wkey)s) (node_namespace_workload_pod_target_engine:gpuledger_engine_headroom:max)
            ||| % { wkey: wkey },
          },
          // Per queueing engine: the rank (stages.json order, strongest highest) of the
          // strongest engine_queueing reason that holds for it.
          {
            record: 'node_namespace_workload_pod_target_engine:gpuledger_engine_queue_reason_rank:max',
            expr: 'max by (%s) (\n%s\n)\n' % [ekey, indent(std.join('\nor\n', [
              local cond = engineReasonCondition[r];
              if cond == null
              then '%d * (node_namespace_workload_pod_target_engine:gpuledger_engine_queueing:max == 1)' % rank('engine_queueing', r)
              else '%d * (\n  node_namespace_workload_pod_target_engine:gpuledger_engine_queueing:max == 1\n  and on (%s)\n  (\n%s\n  )\n)' % [rank('engine_queueing', r), ekey, indent(cond, 4)]
              // `or` keeps the first present per engine: strongest first.
              for r in stageOf('engine_queueing').reasons
            ]), 2)],
          },
          // ------------------------------------------------------------ routing
          // Requests Ray Serve's routers (proxies, deployment handles) hold for a
          // deployment, not assigned to a replica yet, summed over the nodes.
          {
            record: 'namespace_workload_application_deployment:gpuledger_serve_router_queued_requests:sum',
            expr: |||
              sum by (%(wkey)s, application, deployment) (gpuledger_serve_router_queued_requests{%(sel)s})
            ||| % { wkey: wkey, sel: sel },
          },
          // Requests the endpoint pickers of the workload's InferencePools hold (flow
          // control), summed over its pools: a pool counts for every workload with a
          // member pod in it (gpuledger_inference_pool_member, the cluster view's).
          {
            record: 'namespace_workload:gpuledger_gateway_queued_requests:sum',
            expr: |||
              sum by (%(wkey)s) (
                max by (%(cl)s, namespace, pool) (gpuledger_gateway_queued_requests{%(sel)s})
                * on (%(cl)s, namespace, pool) group_right ()
                group by (%(cl)s, namespace, pool, workload) (gpuledger_inference_pool_member{%(sel)s, workload!=""})
              )
            ||| % { wkey: wkey, cl: cl, sel: sel },
          },
          // Engines that queue while a sibling engine of the same workload has headroom;
          // 0 when the workload's engines are balanced (all queue, or none does).
          {
            record: 'namespace_workload:gpuledger_routing_imbalance:sum',
            expr: |||
              namespace_workload:gpuledger_engine_queueing:sum
              and on (%(wkey)s)
              (namespace_workload:gpuledger_engine_headroom:sum > 0)
              or
              namespace_workload:gpuledger_engine_queueing:sum * 0
            ||| % { wkey: wkey },
          },
          // ------------------------------------------------------------ stage
          // The stage and its reason as one number, stage code * 100 + reason rank: the
          // strongest condition of stages.json that holds.
          {
            record: 'namespace_workload:gpuledger_stage_reason_code:max',
            expr: 'max by (%s) (\n%s\n)\n' % [wkey, indent(std.join('\nor\n', candidates), 2)],
          },
          // The stage code alone (stages.json `code`), for a Grafana state timeline.
          {
            record: 'namespace_workload:gpuledger_stage_code:max',
            expr: |||
              floor(namespace_workload:gpuledger_stage_reason_code:max / 100)
            |||,
          },
        ] + [
          // One series per stage and workload: exactly one of them is 1.
          {
            record: 'namespace_workload_stage:gpuledger_stage_code:onehot',
            expr: 'namespace_workload:gpuledger_stage_code:max == bool %d\n' % s.code,
            labels: { stage: s.stage },
          }
          for s in model.stages
        ] + [
          // One series per workload: its stage and the reason (no `reason` label for a
          // stage without reasons), as `gpuledger explain` names them.
          {
            record: 'namespace_workload_stage_reason:gpuledger_stage_reason_code:group',
            expr: 'group by (%s) (namespace_workload:gpuledger_stage_reason_code:max == %d)\n' % [wkey, code(s.stage, r)],
            labels: { stage: s.stage } + (if r == null then {} else { reason: r }),
          }
          for s in model.stages
          for r in (if s.reasons == [] then [null] else s.reasons)
        ],
      },
      {
        name: 'gpuledger.ledger.rules',
        rules: [
          // Distinct GPUs Kubernetes allocated to a pod (all its containers).
          {
            record: 'node_namespace_pod:gpuledger_gpu_allocation_info:count',
            expr: |||
              count by (%(pkey)s) (
                group by (%(pkey)s, gpu_uuid) (gpuledger_gpu_allocation_info{%(sel)s})
              )
            ||| % { pkey: pkey, sel: sel },
          },
          // A Ray-executor engine's footprint across nodes (docs/design.md, identity rule
          // 9): distinct GPUs its Ray workers' processes hold on every node, joined to the
          // engine on (ray_job_id, ray_driver_node_id); only while every worker Ray lists
          // ALIVE is reported by a node agent (an agent that is down makes it unknown).
          {
            record: 'node_namespace_workload_pod_target_engine:gpuledger_ray_worker_gpus:count',
            expr: |||
              max by (%(ekey)s) (
                max by (%(ekey)s) (
                  gpuledger_engine_ray_job_info{%(sel)s}
                  * on (%(jkey)s) group_left ()
                  (
                    count by (%(jkey)s) (
                      group by (%(jkey)s, node, gpu_uuid) (gpuledger_ray_worker_gpu_memory_used_bytes{%(sel)s})
                    )
                    or
                    0 * count by (%(jkey)s) (gpuledger_ray_worker_info{%(sel)s})
                  )
                )
                and on (%(ekey)s)
                (
                  max by (%(ekey)s) (
                    gpuledger_engine_ray_job_info{%(sel)s}
                    * on (%(jkey)s) group_left ()
                    count by (%(jkey)s) (gpuledger_ray_worker_info{%(sel)s})
                  )
                  >= on (%(ekey)s)
                  max by (%(ekey)s) (gpuledger_engine_ray_workers{%(sel)s, state="ALIVE"})
                )
              )
            ||| % { ekey: ekey, jkey: '%s, ray_job_id, ray_driver_node_id' % cl, sel: sel },
          },
        ],
      },
    ],
  },
}
