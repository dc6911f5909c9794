// The recording rules' names before this release, kept for one release as aliases.
//
// Until this release the recording rules were named `gpuledger:<what>:<aggregation>`; they
// are now named `level:metric:operations` (rules/rules.libsonnet; docs/mixin.md, "Recording
// rule names"). While `_config.deprecatedRecordingRuleAliases` is true, one more group,
// `gpuledger.deprecated_aliases`, records every old name from its new one: the same series
// with the same labels and values, one evaluation later at most (Prometheus runs groups
// independently). Nothing of the mixin reads them; they keep your own dashboards, alerts and
// queries working while you move them to the new names. The per-engine ones
// (gpuledger:engine_*) now carry `target` too, as every engine series does: an engine is one
// scrape target, model and data-parallel rank.
//
// The group and the setting will be removed in the next release.
local renamed = [
  // [old name, new name], in the order of rules/rules.libsonnet.
  ['gpuledger:workload_pods_pending_placement:sum', 'namespace_workload_reason:gpuledger_pod_pending_placement:sum'],
  ['gpuledger:workload_gpus_pending_placement:sum', 'namespace_workload:gpuledger_pod_pending_gpus:sum'],
  ['gpuledger:workload_ray_gpus_pending:sum', 'namespace_workload_kind:gpuledger_ray_pending_gpus:sum'],
  ['gpuledger:workload_ray_placement_groups_pending:sum', 'namespace_workload_scheduling_state:gpuledger_ray_placement_groups_pending:sum'],
  ['gpuledger:workload_pods_starting:sum', 'namespace_workload:gpuledger_pod_starting:sum'],
  ['gpuledger:workload_engines_up:sum', 'namespace_workload:gpuledger_engine_up:sum'],
  ['gpuledger:workload_engines_expected:count', 'namespace_workload:gpuledger_engine_up:count'],
  ['gpuledger:workload_requests_waiting:sum', 'namespace_workload:gpuledger_engine_requests_waiting:sum'],
  ['gpuledger:workload_requests_running:sum', 'namespace_workload:gpuledger_engine_requests_running:sum'],
  ['gpuledger:workload_requests_waiting_by_reason:sum', 'namespace_workload_reason:gpuledger_engine_requests_waiting_by_reason:sum'],
  ['gpuledger:workload_kv_cache_usage:max', 'namespace_workload:gpuledger_engine_kv_cache_usage_ratio:max'],
  ['gpuledger:workload_preemptions:rate5m', 'namespace_workload:gpuledger_engine_preemptions:rate5m'],
  ['gpuledger:engine_queueing:max', 'node_namespace_workload_pod_target_engine:gpuledger_engine_queueing:max'],
  ['gpuledger:engine_at_max_num_seqs:max', 'node_namespace_workload_pod_target_engine:gpuledger_engine_at_max_num_seqs:max'],
  ['gpuledger:engine_headroom:max', 'node_namespace_workload_pod_target_engine:gpuledger_engine_headroom:max'],
  ['gpuledger:workload_engines_queueing:count', 'namespace_workload:gpuledger_engine_queueing:sum'],
  ['gpuledger:workload_engines_with_headroom:count', 'namespace_workload:gpuledger_engine_headroom:sum'],
  ['gpuledger:engine_queue_reason_rank:max', 'node_namespace_workload_pod_target_engine:gpuledger_engine_queue_reason_rank:max'],
  ['gpuledger:workload_routing_imbalance:count', 'namespace_workload:gpuledger_routing_imbalance:sum'],
  ['gpuledger:workloads:group', 'namespace_workload:gpuledger_workloads:group'],
  ['gpuledger:workload_stage_reason_code:max', 'namespace_workload:gpuledger_stage_reason_code:max'],
  ['gpuledger:workload_stage_code:max', 'namespace_workload:gpuledger_stage_code:max'],
  ['gpuledger:workload_stage:onehot', 'namespace_workload_stage:gpuledger_stage_code:onehot'],
  ['gpuledger:workload_stage_reason:group', 'namespace_workload_stage_reason:gpuledger_stage_reason_code:group'],
  ['gpuledger:pod_gpus_allocated:count', 'node_namespace_pod:gpuledger_gpu_allocation_info:count'],
];
// Recording rules added since the rename: they never had an old name.
local added = [
  'namespace_workload_application_deployment:gpuledger_serve_router_queued_requests:sum',
  'node_namespace_workload_pod_target_engine:gpuledger_ray_worker_gpus:count',
  'namespace_workload:gpuledger_gateway_queued_requests:sum',
];

{
  local groupName = 'gpuledger.deprecated_aliases',
  local recorded = std.set([
    r.record
    for g in super.prometheusRules.groups
    for r in g.rules
    if std.objectHas(r, 'record')
  ]),
  assert std.set([p[1] for p in renamed] + added) == recorded
         : 'rules/aliases.libsonnet must alias every recording rule of rules/rules.libsonnet that had an old name (the others are `added`), and only those',

  prometheusRules+:: {
    groups+: if !$._config.deprecatedRecordingRuleAliases then [] else [
      {
        name: groupName,
        rules: [{ record: p[0], expr: p[1] } for p in renamed],
      },
    ],
  },
}
