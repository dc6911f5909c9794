// "Engines": per vLLM engine, requests running and waiting, KV-cache usage, preemptions,
// its configuration and the GPUs its processes hold.
local g = import '../lib/dashboards.libsonnet';

{
  grafanaDashboards+:: {
    local c = $._config,
    local wl = ['namespace=~"$namespace"', 'workload=~"$workload"'],
    local R(m=[]) = g.selector(c, wl + m),
    local W = g.selector(c, wl, raw=false),
    // An engine is one scrape target, model and data-parallel rank (docs/design.md, identity
    // rule 6): two targets of one pod serving the same model are two engines, and two lines.
    // `node` too: a target without a pod (--vllm-target localhost:8000) can repeat on nodes.
    local engineKey = 'node, namespace, workload, pod, target, model_name, engine',
    local by = 'node, namespace, pod, target, model_name, engine',
    local legend = '{{namespace}}/{{pod}} engine {{engine}} ({{target}})',
    local configLabels = 'tensor_parallel_size, pipeline_parallel_size, data_parallel_size, max_num_seqs, num_gpu_blocks, block_size',
    // A per-engine series with the engine's configuration labels joined on.
    local withConfig(series) = |||
      max by (%%(k)s) (%s)
      * on (%%(k)s) group_left (%s)
      max by (%%(k)s, %s) (gpuledger_engine_config_info%%(R)s)
    ||| % [series, configLabels, configLabels],

    'gpuledger-engines.json': g.dashboard(
      c,
      'GPU Ledger / Engines',
      c.dashboardUids.engines,
      'Per vLLM engine: requests running and waiting, KV-cache usage, preemptions, configuration and the GPUs its processes hold.',
      [
        g.datasourceVariable,
        g.clusterVariable(c, 'gpuledger_engine_up'),
        g.queryVariable('namespace', 'Namespace', 'label_values(gpuledger_engine_up%s, namespace)' % g.selector(c, [])),
        g.queryVariable('workload', 'Workload', 'label_values(gpuledger_engine_up%s, workload)' % g.selector(c, ['namespace=~"$namespace"'])),
      ],
      [
        {
          height: 4,
          panels: [
            g.stat('Engines up', 'vLLM engines whose last scrape succeeded.', 'short', [g.target('sum(namespace_workload:gpuledger_engine_up:sum%s) or vector(0)' % W)]),
            g.stat('Engines expected', 'vLLM engines gpuledger knows of, up or not.', 'short', [g.target('sum(namespace_workload:gpuledger_engine_up:count%s) or vector(0)' % W)]),
            g.stat(
              'Engines queueing',
              'Engines with waiting requests now.',
              'short',
              [g.target('sum(namespace_workload:gpuledger_engine_queueing:sum%s) or vector(0)' % W)],
              [{ color: 'green', value: null }, { color: 'yellow', value: 1 }],
            ),
            g.stat('Engines with headroom', 'Engines that could take more requests now.', 'short', [g.target('sum(namespace_workload:gpuledger_engine_headroom:sum%s) or vector(0)' % W)]),
          ],
        },
        {
          title: 'Requests',
          height: 8,
          panels: [
            g.timeseries(
              'Requests running',
              "Requests in each engine's running batch, and its max_num_seqs (where the flag is set): the batch never grows past it.",
              'short',
              [
                g.target('sum by (%s) (gpuledger_engine_requests%s)' % [by, R(['state="running"'])], legend),
                g.target('max by (%s) (gpuledger_engine_max_num_seqs%s)' % [by, R()], legend + ' max_num_seqs'),
              ],
            ),
            g.timeseries(
              'Requests waiting',
              'Requests queued inside each engine.',
              'short',
              [g.target('sum by (%s) (gpuledger_engine_requests%s)' % [by, R(['state="waiting"'])], legend)],
            ),
            g.timeseries(
              'Requests waiting, by reason',
              'capacity: no room in the batch; deferred: held by a transient constraint (LoRA budget, KV transfer). vLLM 0.20 and later.',
              'short',
              [g.target('sum by (%s, reason) (gpuledger_engine_requests_waiting_by_reason%s)' % [by, R()], legend + ' {{reason}}')],
              stack=true,
            ),
          ],
        },
        {
          // From the request spans the agents receive (docs/spans.md): each point's
          // exemplar is a request's trace id, linked to its trace in the tracing backend.
          title: 'Request latency (from request spans)',
          height: 8,
          panels: [
            g.timeseries(
              'Queue time, p99',
              "99th percentile of the time finished requests waited in each engine's queue (its spans' gen_ai.latency.time_in_queue). Exemplars are requests' trace ids: gpuledger explain --request TRACE_ID walks one down to its GPUs.",
              's',
              [g.target('histogram_quantile(0.99, sum by (%s, le) (rate(gpuledger_engine_request_queue_seconds_bucket%s[$__rate_interval])))' % [by, R()], legend, exemplar=true)],
            ),
            g.timeseries(
              'Time to first token, p99',
              "99th percentile of the time from a request's arrival to its first token (gen_ai.latency.time_to_first_token), per engine; exemplars as above.",
              's',
              [g.target('histogram_quantile(0.99, sum by (%s, le) (rate(gpuledger_engine_request_ttft_seconds_bucket%s[$__rate_interval])))' % [by, R()], legend, exemplar=true)],
            ),
          ],
        },
        {
          title: 'KV cache and preemptions',
          height: 8,
          panels: [
            g.timeseries(
              'KV-cache usage',
              "Fraction of each engine's KV-cache blocks in use. Dashed lines: the headroom and pressure thresholds of the alerts.",
              'percentunit',
              [g.target('max by (%s) (gpuledger_engine_kv_cache_usage_ratio%s)' % [by, R()], legend)],
              max=1,
              thresholds=[[c.kvCacheHeadroomRatio, 'yellow'], [c.kvCachePressureRatio, 'red']],
            ),
            g.timeseries(
              'Preemptions',
              'Requests preempted per second: the KV cache ran out mid-generation and their work is recomputed.',
              'ops',
              [g.target('sum by (%s) (rate(gpuledger_engine_preemptions_total%s[$__rate_interval]))' % [by, R()], legend)],
            ),
          ],
        },
        {
          title: 'State',
          height: 7,
          panels: [
            g.stateTimeline(
              'Engine up',
              'Whether the last scrape of each engine succeeded.',
              [g.target('max by (%s) (gpuledger_engine_up%s)' % [by, R()], legend)],
              [[1, 'up', 'green'], [0, 'down', 'red']],
            ),
            g.stateTimeline(
              'Engine queueing',
              'Whether requests wait in each engine (node_namespace_workload_pod_target_engine:gpuledger_engine_queueing:max).',
              [g.target('max by (%s) (node_namespace_workload_pod_target_engine:gpuledger_engine_queueing:max%s)' % [by, W], legend)],
              [[1, 'queueing', 'yellow'], [0, 'not queueing', 'green']],
            ),
            g.stateTimeline(
              'Engine at max_num_seqs',
              'Whether the engine runs exactly max_num_seqs requests (node_namespace_workload_pod_target_engine:gpuledger_engine_at_max_num_seqs:max): the batch cannot grow.',
              [g.target('max by (%s) (node_namespace_workload_pod_target_engine:gpuledger_engine_at_max_num_seqs:max%s)' % [by, W], legend)],
              [[1, 'at max_num_seqs', 'orange'], [0, 'below', 'green']],
            ),
          ],
        },
        {
          title: 'Configuration and GPUs',
          height: 8,
          panels: [
            g.table(
              'Configuration and GPUs',
              'Per engine (scrape target, model, data-parallel rank): parallelism, max_num_seqs and KV-cache blocks from its configuration; GPUs it needs (tensor_parallel_size x pipeline_parallel_size) and GPUs its processes hold (NVML). The two should be equal.',
              'short',
              [
                g.target(withConfig('gpuledger_engine_gpus%s' % R(['state="configured"'])) % { k: engineKey, R: R() }),
                g.target(withConfig('gpuledger_engine_gpus%s' % R(['state="in_use"'])) % { k: engineKey, R: R() }),
              ],
              [
                ['namespace', 'Namespace'],
                ['pod', 'Pod'],
                ['target', 'Target'],
                ['model_name', 'Model'],
                ['engine', 'Engine'],
                ['tensor_parallel_size', 'TP'],
                ['pipeline_parallel_size', 'PP'],
                ['data_parallel_size', 'DP'],
                ['max_num_seqs', 'max_num_seqs'],
                ['num_gpu_blocks', 'KV blocks'],
                ['block_size', 'Block size'],
                ['Value #A', 'GPUs needed'],
                ['Value #B', 'GPUs held'],
              ],
            ),
            g.table(
              'GPUs held by engine processes',
              "Each GPU an engine's processes hold a context on, with the process role and rank.",
              'short',
              [g.target('max by (%s, role, rank, gpu_uuid) (gpuledger_engine_gpu_info%s)' % [by, R()])],
              [['namespace', 'Namespace'], ['pod', 'Pod'], ['target', 'Target'], ['engine', 'Engine'], ['role', 'Role'], ['rank', 'Rank'], ['gpu_uuid', 'GPU UUID']],
            ),
          ],
        },
        {
          title: 'Links between GPUs',
          height: 7,
          panels: [
            g.table(
              "Weakest link among an engine's GPUs",
              'Per engine on two GPUs or more, the weakest link between any two of its GPUs on its node (NVML topology): nvlink, then internal (one board), single (one PCIe switch), multiple (several switches), hostbridge, node (across host bridges of one NUMA node), system (across NUMA nodes: the CPU interconnect), or unknown (NVML did not say). Tensor parallelism runs at the pace of its weakest pair.',
              'short',
              [g.target('max by (%s, link) (gpuledger_engine_gpu_link_weakest%s == 1)' % [by, R()])],
              [['node', 'Node'], ['namespace', 'Namespace'], ['pod', 'Pod'], ['target', 'Target'], ['model_name', 'Model'], ['engine', 'Engine'], ['link', 'Weakest link']],
            ),
            g.table(
              "Weakest link among a Ray-executor engine's ranks per node",
              'For an engine on the Ray executor, per node and Ray job: the weakest link among the GPUs its worker actors hold there. Ranks on different nodes meet over the network, which NVML does not see.',
              'short',
              [g.target('max by (node, namespace, pod, ray_job_id, ray_driver_node_id, link) (gpuledger_ray_engine_gpu_link_weakest%s == 1)' % R())],
              [['node', 'Node'], ['namespace', 'Namespace'], ['pod', 'Ray pod'], ['ray_job_id', 'Ray job'], ['ray_driver_node_id', 'Driver node'], ['link', 'Weakest link']],
            ),
          ],
        },
      ],
    ),
  },
}
