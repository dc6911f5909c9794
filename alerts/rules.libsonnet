// Recording rules `gpuledger:<what>:<aggregation>`.
//
// Workload identity is (cluster, namespace, workload). Engine identity adds node, pod,
// pod_uid, model_name and engine (the vLLM data-parallel rank). Ray series from the
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
  local ekey = '%s, node, namespace, workload, pod, pod_uid, model_name, engine' % cl,
  local pkey = '%s, node, namespace, pod, pod_uid' % cl,

  // Series that name a workload and always carry its namespace.
  local namespacedWorkloadSeries = [
    'gpuledger_pod_pending_placement{%s, workload!=""}' % sel,
    'gpuledger_pod_starting{%s, workload!=""}' % sel,
    'gpuledger_engine_up{%s, workload!=""}' % sel,
    'gpuledger_ray_actor_gpus{%s, workload!=""}' % sel,
    'gpuledger_ray_pending_gpus{%s, workload!="", namespace!=""}' % sel,
    'gpuledger_ray_placement_groups{%s, workload!="", namespace!=""}' % sel,
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

  // Stage precedence, strongest first. The code is what gpuledger:workload_stage_code:max
  // records; gpuledger:workload_stage:onehot has one series per entry.
  stages:: [
    { stage: 'pending_placement', code: 4 },
    { stage: 'starting', code: 3 },
    { stage: 'engine_queueing', code: 2 },
    { stage: 'serving', code: 1 },
    { stage: 'idle', code: 0 },
  ],

  prometheusRules+:: {
    groups+: [
      {
        name: 'gpuledger.rules',
        rules: [
          // ------------------------------------------------------------ placement
          {
            record: 'gpuledger:workload_pods_pending_placement:sum',
            expr: |||
              sum by (%(wkey)s, reason) (
                gpuledger_pod_pending_placement{%(sel)s}
                and on (%(cl)s, pod_uid)
                (gpuledger_pod_pending_gpus{%(sel)s} > 0)
              )
            ||| % { wkey: wkey, sel: sel, cl: cl },
          },
          {
            record: 'gpuledger:workload_gpus_pending_placement:sum',
            expr: |||
              sum by (%(wkey)s) (gpuledger_pod_pending_gpus{%(sel)s})
            ||| % { wkey: wkey, sel: sel },
          },
          {
            record: 'gpuledger:workload_ray_gpus_pending:sum',
            expr: |||
              sum by (%(wkey)s, kind) (gpuledger_ray_pending_gpus{%(sel)s})
            ||| % { wkey: wkey, sel: sel },
          },
          {
            record: 'gpuledger:workload_ray_placement_groups_pending:sum',
            expr: |||
              sum by (%(wkey)s, scheduling_state) (gpuledger_ray_placement_groups{%(sel)s, state="PENDING"})
            ||| % { wkey: wkey, sel: sel },
          },
          // ------------------------------------------------------------ startup
          {
            record: 'gpuledger:workload_pods_starting:sum',
            expr: |||
              sum by (%(wkey)s) (gpuledger_pod_starting{%(sel)s})
            ||| % { wkey: wkey, sel: sel },
          },
          {
            record: 'gpuledger:workload_engines_up:sum',
            expr: |||
              sum by (%(wkey)s) (gpuledger_engine_up{%(sel)s})
            ||| % { wkey: wkey, sel: sel },
          },
          {
            record: 'gpuledger:workload_engines_expected:count',
            expr: |||
              count by (%(wkey)s) (gpuledger_engine_up{%(sel)s})
            ||| % { wkey: wkey, sel: sel },
          },
          // ------------------------------------------------------------ engines
          {
            record: 'gpuledger:workload_requests_waiting:sum',
            expr: |||
              sum by (%(wkey)s) (gpuledger_engine_requests{%(sel)s, state="waiting"})
            ||| % { wkey: wkey, sel: sel },
          },
          {
            record: 'gpuledger:workload_requests_running:sum',
            expr: |||
              sum by (%(wkey)s) (gpuledger_engine_requests{%(sel)s, state="running"})
            ||| % { wkey: wkey, sel: sel },
          },
          {
            record: 'gpuledger:workload_requests_waiting_by_reason:sum',
            expr: |||
              sum by (%(wkey)s, reason) (gpuledger_engine_requests_waiting_by_reason{%(sel)s})
            ||| % { wkey: wkey, sel: sel },
          },
          {
            record: 'gpuledger:workload_kv_cache_usage:max',
            expr: |||
              max by (%(wkey)s) (gpuledger_engine_kv_cache_usage_ratio{%(sel)s})
            ||| % { wkey: wkey, sel: sel },
          },
          {
            record: 'gpuledger:workload_preemptions:rate5m',
            expr: |||
              sum by (%(wkey)s) (rate(gpuledger_engine_preemptions_total{%(sel)s}[5m]))
            ||| % { wkey: wkey, sel: sel },
          },
          // Per engine, 0/1 for every engine that is up: requests wait in it.
          {
            record: 'gpuledger:engine_queueing:max',
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
            record: 'gpuledger:engine_at_max_num_seqs:max',
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
            record: 'gpuledger:engine_headroom:max',
            expr: |||
              (
                gpuledger:engine_queueing:max == 0
                and on (%(ekey)s)
                (max by (%(ekey)s) (gpuledger_engine_kv_cache_usage_ratio{%(sel)s}) < %(headroom)g)
                unless on (%(ekey)s)
                (gpuledger:engine_at_max_num_seqs:max == 1)
              ) * 0 + 1
              or
              gpuledger:engine_queueing:max * 0
            ||| % { ekey: ekey, sel: sel, headroom: c.kvCacheHeadroomRatio },
          },
          {
            record: 'gpuledger:workload_engines_queueing:count',
            expr: |||
              sum by (%(wkey)s) (gpuledger:engine_queueing:max)
            ||| % { wkey: wkey },
          },
          {
            record: 'gpuledger:workload_engines_with_headroom:count',
            expr: |||
              sum by (%(wkey)s) (gpuledger:engine_headroom:max)
            ||| % { wkey: wkey },
          },
          // ------------------------------------------------------------ routing
          // Engines that queue while a sibling engine of the same workload has headroom;
          // 0 when the workload's engines are balanced (all queue, or none does).
          {
            record: 'gpuledger:workload_routing_imbalance:count',
            expr: |||
              gpuledger:workload_engines_queueing:count
              and on (%(wkey)s)
              (gpuledger:workload_engines_with_headroom:count > 0)
              or
              gpuledger:workload_engines_queueing:count * 0
            ||| % { wkey: wkey },
          },
          // ------------------------------------------------------------ stage
          // Every workload any layer knows. A namespace-less Ray key is kept only while no
          // namespaced series names a workload of that name.
          {
            record: 'gpuledger:workloads:group',
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
          // The stage code: the highest-precedence condition that holds (4 pending
          // placement, 3 starting, 2 engine queueing, 1 serving, 0 idle).
          {
            record: 'gpuledger:workload_stage_code:max',
            expr: |||
              max by (%(wkey)s) (
                4 * (
                  gpuledger:workloads:group
                  and on (%(wkey)s) (gpuledger:workload_gpus_pending_placement:sum > 0)
                  or
                  gpuledger:workloads:group
                  and on (%(wkey)s) (sum by (%(wkey)s) (gpuledger:workload_ray_gpus_pending:sum) > 0)
                  or
                  gpuledger:workloads:group
                  and on (%(cl)s, workload) (sum by (%(cl)s, workload) (gpuledger:workload_ray_gpus_pending:sum{namespace=""}) > 0)
                )
                or
                3 * (
                  gpuledger:workloads:group
                  and on (%(wkey)s) (gpuledger:workload_pods_starting:sum > 0)
                  or
                  gpuledger:workloads:group
                  and on (%(wkey)s) (gpuledger:workload_engines_up:sum < gpuledger:workload_engines_expected:count)
                )
                or
                2 * (
                  gpuledger:workloads:group
                  and on (%(wkey)s) (gpuledger:workload_requests_waiting:sum >= %(minWaiting)d)
                )
                or
                1 * (
                  gpuledger:workloads:group
                  and on (%(wkey)s) (gpuledger:workload_requests_running:sum > 0)
                )
                or
                0 * gpuledger:workloads:group
              )
            ||| % { wkey: wkey, cl: cl, minWaiting: c.queueingMinWaitingRequests },
          },
        ] + [
          // One series per stage and workload: exactly one of them is 1.
          {
            record: 'gpuledger:workload_stage:onehot',
            expr: 'gpuledger:workload_stage_code:max == bool %d\n' % s.code,
            labels: { stage: s.stage },
          }
          for s in $.stages
        ],
      },
      {
        name: 'gpuledger.ledger.rules',
        rules: [
          // Distinct GPUs Kubernetes allocated to a pod (all its containers).
          {
            record: 'gpuledger:pod_gpus_allocated:count',
            expr: |||
              count by (%(pkey)s) (
                group by (%(pkey)s, gpu_uuid) (gpuledger_gpu_allocation_info{%(sel)s})
              )
            ||| % { pkey: pkey, sel: sel },
          },
        ],
      },
    ],
  },
}
