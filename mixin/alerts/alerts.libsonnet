// Alerts. Every alert has `severity` (warning|critical) and `layer`, the layer a person
// has to act in, which is what Alertmanager routes on:
//
//   placement  Kubernetes or Ray cannot place the workload's GPU work
//   startup    placed, but the engine does not serve yet
//   engine     engines up and queueing: KV cache or max_num_seqs bound
//   routing    some engines queue while siblings have headroom, or a gateway's endpoint
//              picker or a Ray Serve router holds requests while no engine queues, or an
//              InferencePool has no ready endpoint
//   ledger     allocation and physical use of GPUs disagree
//   exporter   gpuledger itself is blind
//
// Placement and engine queueing never fire together for one workload: the startup, routing
// and engine alerts only fire while the workload is in their stage, a workload is in one
// stage at a time (lib/stages.json: pending_placement > starting > routing >
// engine_queueing > ...), and an engine alert fires only for an engine whose reason
// (node_namespace_workload_pod_target_engine:gpuledger_engine_queue_reason_rank:max) is the
// alert's: what `gpuledger explain` says.
// Those alerts take their `layer` from their stage in stages.json.
// `runbook_url` is added to every alert in one place: add-runbook-links.libsonnet.
{
  local c = $._config,
  local sel = c.gpuledgerSelector,
  local cl = c.clusterLabel,
  local wkey = '%s, namespace, workload' % cl,
  // An engine: one scrape target, model and data-parallel rank (docs/design.md, identity
  // rule 6). `target` keeps two engines of one pod (two targets, same model and rank) apart.
  local ekey = '%s, node, namespace, workload, pod, pod_uid, model_name, target, engine' % cl,

  // `namespace/workload`, or only `workload` for namespace-less Ray series.
  local workloadText = '{{ with $labels.namespace }}{{ . }}/{{ end }}{{ $labels.workload }}',
  // An engine in no pod (a bare host: docs/design.md, identity rule 7) by its node.
  local engineText = 'engine {{ $labels.engine }} (model {{ $labels.model_name }}, target {{ $labels.target }}) {{ if $labels.pod }}in pod {{ $labels.namespace }}/{{ $labels.pod }}{{ else }}on host {{ $labels.node }} (in no pod){{ end }} of workload {{ $labels.workload }}',
  local stageOf(name) = [s for s in $._stages.stages if s.stage == name][0],

  // ------------------------------------------------------------------ next steps
  // The stage alerts' description ends with the next step `gpuledger explain` and the
  // /ledger page print for the verdict (lib/stages.json; explain/verdict.py's
  // next_step_for): the reason's by_reason.<reason>.next_step, else the stage's. An alert
  // stands for the (stage, reason) verdicts whose runbook_alert it is. One verdict: its
  // step, verbatim. Several: a template switch on `subject` (a template expression that
  // holds the reason), the stage's step for any other value. tests/mixin/test_next_steps.py
  // compares every branch with stages.json.
  local byReason(stage) = std.get(stage, 'by_reason', {}),
  local stepOf(stage, reason) =
    local own = std.get(byReason(stage), reason, null);
    if own == null then stage else own,
  local verdictsOf(alert) = [
    [s, r]
    for s in $._stages.stages
    for r in s.reasons
    if stepOf(s, r).runbook_alert == alert
  ],
  local nextStep(alert, subject=null) =
    local verdicts = verdictsOf(alert);
    local stages = std.set([v[0].stage for v in verdicts]);
    local steps = std.set([stepOf(v[0], v[1]).next_step for v in verdicts]);
    assert verdicts != [] : '%s is the runbook_alert of no verdict of stages.json' % alert;
    assert std.length(stages) == 1 : '%s stands for verdicts of several stages' % alert;
    assert std.length(steps) == 1 || subject != null : '%s: several next steps, no reason to tell them apart' % alert;
    ' Next step: ' + (
      if std.length(steps) == 1 then steps[0]
      else std.join('', [
        '{{ ' + (if i == 0 then '' else 'else ') + 'if eq ' + subject + ' "' + verdicts[i][1] + '" }}'
        + stepOf(verdicts[i][0], verdicts[i][1]).next_step
        for i in std.range(0, std.length(verdicts) - 1)
      ]) + '{{ else }}' + verdicts[0][0].next_step + '{{ end }}'
    ),
  local inStage(stage) = std.rstripChars(|||
    and on (%(wkey)s)
    (namespace_workload_stage:gpuledger_stage_code:onehot{stage="%(stage)s"} == 1)
  ||| % { wkey: wkey, stage: stage }, '\n'),
  // An engine whose strongest engine_queueing reason is `reason`.
  local engineReason(reason) =
    local reasons = stageOf('engine_queueing').reasons;
    std.rstripChars(|||
      and on (%(ekey)s)
      (node_namespace_workload_pod_target_engine:gpuledger_engine_queue_reason_rank:max == %(rank)d)
    ||| % { ekey: ekey, rank: std.length(reasons) - std.find(reason, reasons)[0] }, '\n'),
  // The device an alert names: a GPU, or a MIG device of one.
  local deviceText = '{{ if $labels.parent_gpu_uuid }}MIG device {{ $labels.gpu_uuid }} of GPU {{ $labels.parent_gpu_uuid }}{{ else }}GPU {{ $labels.gpu_uuid }}{{ end }}',
  // Sources that are down: configured, and their last fetch failed. gpuledger_source_state
  // (a state set: up, down, not_configured) tells a down source from one this exporter is
  // not set up to read, which gpuledger_source_up reports as 0 too. An exporter without
  // gpuledger_source_state (older versions) falls back to gpuledger_source_up == 0, with
  // the condition `old` on top. `matchers` narrow every selector.
  local indentBy(n, text) = std.join('\n', [std.repeat(' ', n) + l for l in std.split(text, '\n')]),
  local sourcesDown(matchers, old='') =
    local m = if matchers == '' then sel else sel + ', ' + matchers;
    std.rstripChars(|||
      max without (state) (gpuledger_source_state{%(m)s, state="down"} == 1)
      or
      (
        gpuledger_source_up{%(m)s} == 0
        unless on (%(cl)s, job, instance, source)
        gpuledger_source_state{%(m)s}%(old)s
      )
    ||| % { cl: cl, m: m, old: if old == '' then '' else '\n' + indentBy(2, std.rstripChars(old, '\n')) }, '\n'),
  // Ledger alerts stay silent on a node where a source the ledger needs is down (not where
  // it is not configured).
  local ledgerSourcesUp = |||
    unless on (%(cl)s, node)
    (
    %(down)s
    )
  ||| % { cl: cl, down: indentBy(2, sourcesDown('source=~"%s"' % c.ledgerSourcesRegex)) },

  // GpuLedgerExporterDown, one condition per way of going blind: a target that fails; an
  // expected agent with no target at all; and, where kube-state-metrics is scraped, fewer
  // node-agent targets than nodes with GPUs (per cluster; while no node agent exists
  // anywhere, absent() says so alone). A GPU node is one with GPU capacity
  // (kube-state-metrics), or one whose ResourceSlices publish GPU devices (the cluster
  // view's gpuledger_dra_node_gpu_devices, by dra_node: DRA-only nodes have no capacity);
  // a node both say is counted once (`or` on cluster and node).
  local gpuNodes = 'count by (%(cl)s) (%(capacity)s or %(slices)s)' % {
    cl: cl,
    capacity: 'group by (%s, node) (kube_node_status_capacity{%s, resource=~"%s"} > 0)'
              % [cl, c.kubeStateMetricsSelector, c.gpuNodeResourceRegex],
    slices: 'group by (%s, node) (label_replace(gpuledger_dra_node_gpu_devices{%s} > 0, "node", "$1", "dra_node", "(.+)"))'
            % [cl, sel],
  },
  local exporterDown =
    ['up{%s} == 0' % sel]
    + ['absent(up{%s})' % s for s in [c.gpuledgerNodeSelector, c.gpuledgerClusterSelector] if s != '']
    + (if c.kubeStateMetricsSelector == '' || c.gpuledgerNodeSelector == '' then [] else [std.rstripChars(|||
         (
           %(gpuNodes)s
           -
           (
             count by (%(cl)s) (up{%(node)s})
             or
             %(gpuNodes)s * 0
           )
         ) > 0
         and on ()
         (count(up{%(node)s}) > 0)
       ||| % { cl: cl, node: c.gpuledgerNodeSelector, gpuNodes: gpuNodes }, '\n')]),

  local pendingReasons = [
    ['insufficient_gpu', 'no node that would take the pod has enough free GPUs'],
    ['node_selector', "no node matches the pod's node selector or node affinity"],
    ['affinity', 'pod affinity or anti-affinity rules exclude every node'],
    ['taint', 'the nodes with room carry taints the pod does not tolerate, or are cordoned'],
    ['scheduling_gated', 'a scheduling gate holds the pod (queue admission such as Kueue quota)'],
    // Kubernetes DRA (kube-scheduler's DynamicResources plugin).
    ['claim_unallocatable', "no node has free devices that fit the pod's ResourceClaims"],
    ['device_class_missing', 'a ResourceClaim names a DeviceClass that does not exist'],
    ['claim_deleting', 'a ResourceClaim the pod needs is being deleted'],
    ['claim_in_use', 'a shared ResourceClaim is reserved for as many pods as it may be'],
    ['claim_allocating', "the scheduler is still allocating the pod's ResourceClaim"],
  ],
  local reasonText =
    std.join('', [
      '{{ %sif eq $labels.reason "%s" }}%s' % [if i == 0 then '' else 'else ', pendingReasons[i][0], pendingReasons[i][1]]
      for i in std.range(0, std.length(pendingReasons) - 1)
    ]) + "{{ else }}the scheduler gives another reason (see the pod's PodScheduled condition){{ end }}",

  prometheusAlerts+:: {
    groups+: [
      {
        name: 'gpuledger.placement',
        rules: [
          {
            alert: 'GpuLedgerPodsPendingPlacement',
            expr: |||
              namespace_workload_reason:gpuledger_pod_pending_placement:sum > 0
            |||,
            'for': c.podsPendingPlacementFor,
            labels: { severity: 'warning', layer: stageOf('pending_placement').layer },
            annotations: {
              summary: 'GPU pods of a workload cannot be placed on a node.',
              description: '{{ $value }} GPU pod(s) of workload ' + workloadText + ' have been pending placement for %s: ' % c.podsPendingPlacementFor + reasonText + ' (reason {{ $labels.reason }}).'
                           + nextStep('GpuLedgerPodsPendingPlacement', '$labels.reason'),
            },
          },
          {
            alert: 'GpuLedgerRayPlacementGroupsInfeasible',
            expr: |||
              namespace_workload_scheduling_state:gpuledger_ray_placement_groups_pending:sum{scheduling_state="INFEASIBLE"} > 0
            |||,
            'for': c.rayPlacementGroupsInfeasibleFor,
            labels: { severity: 'warning', layer: stageOf('pending_placement').layer },
            annotations: {
              summary: 'Ray placement groups ask for resources no node of the Ray cluster can ever provide.',
              description: '{{ $value }} Ray placement group(s) of workload ' + workloadText + ' have been INFEASIBLE for %s: their bundles fit on no node the Ray cluster has or can autoscale to. Waiting will not help.' % c.rayPlacementGroupsInfeasibleFor
                           + nextStep('GpuLedgerRayPlacementGroupsInfeasible'),
            },
          },
          {
            alert: 'GpuLedgerRayPlacementGroupsWaiting',
            expr: |||
              namespace_workload_scheduling_state:gpuledger_ray_placement_groups_pending:sum{scheduling_state="NO_RESOURCES"} > 0
            |||,
            'for': c.rayPlacementGroupsWaitingFor,
            labels: { severity: 'warning', layer: stageOf('pending_placement').layer },
            annotations: {
              summary: 'Ray placement groups wait for resources that are in use.',
              description: '{{ $value }} Ray placement group(s) of workload ' + workloadText + ' have been waiting for resources (NO_RESOURCES) for %s: they would fit, but the Ray nodes that could hold them are busy.' % c.rayPlacementGroupsWaitingFor
                           + nextStep('GpuLedgerRayPlacementGroupsWaiting'),
            },
          },
        ],
      },
      {
        name: 'gpuledger.startup',
        rules: [
          {
            alert: 'GpuLedgerWorkloadStartingTooLong',
            expr: |||
              max by (%(wkey)s) (namespace_workload_stage:gpuledger_stage_code:onehot{stage="starting"} == 1)
            ||| % { wkey: wkey },
            'for': c.workloadStartingFor,
            labels: { severity: 'warning', layer: stageOf('starting').layer },
            annotations: {
              summary: 'A workload is placed but its engines have not come up.',
              // The reason is not a label (it may change while the workload starts, which
              // would restart `for`): the template reads it from the rules.
              description: 'Workload ' + workloadText + ' has been starting for %s: its pods are placed on nodes, but GPU containers are not ready or vLLM engines do not answer.' % c.workloadStartingFor
                           + '{{ $reason := "" }}{{ with printf `namespace_workload_stage_reason:gpuledger_stage_reason_code:group{stage="starting",' + cl + '=%q,namespace=%q,workload=%q}` $labels.' + cl + ' $labels.namespace $labels.workload | query }}{{ $reason = . | first | label "reason" }}{{ end }}'
                           + nextStep('GpuLedgerWorkloadStartingTooLong', '$reason'),
            },
          },
        ],
      },
      {
        name: 'gpuledger.engine',
        rules: [
          {
            alert: 'GpuLedgerEngineQueueingKvCachePressure',
            expr: |||
              max by (%(ekey)s) (gpuledger_engine_kv_cache_usage_ratio{%(sel)s})
              %(reason)s
              %(inStage)s
            ||| % { ekey: ekey, sel: sel, reason: engineReason('kv_cache'), inStage: inStage('engine_queueing') },
            'for': c.engineKvCachePressureFor,
            labels: { severity: 'warning', layer: stageOf('engine_queueing').layer },
            annotations: {
              summary: 'A vLLM engine queues requests because its KV cache is full.',
              description: 'Requests have been waiting in ' + engineText + ' for %s with its KV cache {{ $value | humanizePercentage }} full, and no sibling engine has headroom.' % c.engineKvCachePressureFor
                           + nextStep('GpuLedgerEngineQueueingKvCachePressure'),
            },
          },
          {
            alert: 'GpuLedgerEngineQueueingAtMaxNumSeqs',
            expr: |||
              max by (%(ekey)s) (gpuledger_engine_requests{%(sel)s, state="waiting"})
              * on (%(ekey)s) group_left (max_num_seqs)
              max by (%(ekey)s, max_num_seqs) (gpuledger_engine_config_info{%(sel)s})
              %(reason)s
              %(inStage)s
            ||| % { ekey: ekey, sel: sel, reason: engineReason('max_num_seqs'), inStage: inStage('engine_queueing') },
            'for': c.engineMaxNumSeqsFor,
            labels: { severity: 'warning', layer: stageOf('engine_queueing').layer },
            annotations: {
              summary: 'A vLLM engine queues requests at max_num_seqs while its KV cache has room.',
              description: '{{ $value }} request(s) have been waiting in ' + engineText + ' for %s while it runs max_num_seqs={{ $labels.max_num_seqs }} requests and its KV cache is below %s%%: the max_num_seqs setting, not memory, bounds the batch, and no sibling engine has headroom.' % [c.engineMaxNumSeqsFor, '%g' % (c.kvCacheHeadroomRatio * 100)]
                           + nextStep('GpuLedgerEngineQueueingAtMaxNumSeqs'),
            },
          },
          {
            alert: 'GpuLedgerEngineParallelismMismatch',
            // On the Ray executor the engine's GPUs are its Ray workers', on any node: the
            // footprint rule counts them (its own node reports no `in_use` for it).
            expr: |||
              (
                (
                  max by (%(ekey)s) (gpuledger_engine_gpus{%(sel)s, state="in_use"})
                  or
                  node_namespace_workload_pod_target_engine:gpuledger_ray_worker_gpus:count
                )
                != on (%(ekey)s)
                max by (%(ekey)s) (gpuledger_engine_gpus{%(sel)s, state="configured"})
              )
              * on (%(ekey)s) group_left (tensor_parallel_size, pipeline_parallel_size)
              max by (%(ekey)s, tensor_parallel_size, pipeline_parallel_size) (gpuledger_engine_config_info{%(sel)s})
              and on (%(ekey)s)
              (max by (%(ekey)s) (gpuledger_engine_up{%(sel)s}) == 1)
            ||| % { ekey: ekey, sel: sel },
            'for': c.engineParallelismMismatchFor,
            labels: { severity: 'warning', layer: 'engine' },
            annotations: {
              summary: "A vLLM engine's processes hold a different number of GPUs than its parallelism needs.",
              description: 'The processes of ' + engineText + ' have held {{ $value }} GPU(s) for %s, but tensor_parallel_size={{ $labels.tensor_parallel_size }} x pipeline_parallel_size={{ $labels.pipeline_parallel_size }} needs one GPU per rank.' % c.engineParallelismMismatchFor,
            },
          },
        ],
      },
      {
        name: 'gpuledger.routing',
        rules: [
          {
            alert: 'GpuLedgerRoutingImbalance',
            expr: |||
              namespace_workload:gpuledger_routing_imbalance:sum > 0
              %(inStage)s
            ||| % { inStage: inStage('routing') },
            'for': c.routingImbalanceFor,
            labels: { severity: 'warning', layer: stageOf('routing').layer },
            annotations: {
              summary: 'Some engines of a workload queue while sibling engines have headroom.',
              description: '{{ $value }} engine(s) of workload ' + workloadText + ' have had requests waiting for %s while ' % c.routingImbalanceFor
                           + '{{ with printf `namespace_workload:gpuledger_engine_headroom:sum{' + cl + '=%q,namespace=%q,workload=%q}` $labels.' + cl + ' $labels.namespace $labels.workload | query }}{{ . | first | value }}{{ else }}some{{ end }}'
                           + ' sibling engine(s) have headroom: requests are not spread over the replicas.'
                           + nextStep('GpuLedgerRoutingImbalance'),
            },
          },
          {
            alert: 'GpuLedgerServeRouterQueueing',
            expr: |||
              namespace_workload_application_deployment:gpuledger_serve_router_queued_requests:sum >= %(min)g
              and on (%(wkey)s)
              (namespace_workload_stage_reason:gpuledger_stage_reason_code:group{stage="routing", reason="serve_router_queue"} == 1)
            ||| % { wkey: wkey, min: c.queueingMinWaitingRequests },
            'for': c.serveRouterQueueingFor,
            labels: { severity: 'warning', layer: stageOf('routing').layer },
            annotations: {
              summary: 'Requests wait in a Ray Serve router while no engine of the workload queues.',
              description: '{{ $value }} request(s) for Ray Serve deployment {{ $labels.application }}/{{ $labels.deployment }} of workload ' + workloadText + ' have been waiting at its router for %s, not assigned to a replica, while no engine of the workload queues: the replicas are at max_ongoing_requests or the router cannot reach them.' % c.serveRouterQueueingFor
                           + nextStep('GpuLedgerServeRouterQueueing'),
            },
          },
          {
            alert: 'GpuLedgerGatewayQueueing',
            expr: |||
              namespace_workload:gpuledger_gateway_queued_requests:sum >= %(min)g
              and on (%(wkey)s)
              (namespace_workload_stage_reason:gpuledger_stage_reason_code:group{stage="routing", reason="gateway_queue"} == 1)
            ||| % { wkey: wkey, min: c.queueingMinWaitingRequests },
            'for': c.gatewayQueueingFor,
            labels: { severity: 'warning', layer: stageOf('routing').layer },
            annotations: {
              summary: "A gateway's endpoint picker holds requests while engines of the workload have headroom.",
              description: '{{ $value }} request(s) for workload ' + workloadText + ' have been held by the endpoint picker of its InferencePool(s) for %s while no engine of the workload queues and ' % c.gatewayQueueingFor
                           + '{{ with printf `namespace_workload:gpuledger_engine_headroom:sum{' + cl + '=%q,namespace=%q,workload=%q}` $labels.' + cl + ' $labels.namespace $labels.workload | query }}{{ . | first | value }}{{ else }}some{{ end }}'
                           + ' engine(s) have headroom: the requests wait in the gateway.'
                           + nextStep('GpuLedgerGatewayQueueing'),
            },
          },
          {
            // A pool, not a workload: a selector that matches nothing names no workload.
            alert: 'GpuLedgerInferencePoolNoReadyEndpoints',
            expr: |||
              max by (%(cl)s, namespace, pool) (gpuledger_inference_pool_info{%(sel)s})
              unless on (%(cl)s, namespace, pool)
              (gpuledger_inference_pool_member{%(sel)s} == 1)
            ||| % { cl: cl, sel: sel },
            'for': c.inferencePoolNoReadyEndpointsFor,
            labels: { severity: 'critical', layer: 'routing' },
            annotations: {
              summary: 'An InferencePool has no ready endpoint: the gateway cannot send its requests anywhere.',
              description: 'InferencePool {{ $labels.namespace }}/{{ $labels.pool }} has had no Ready pod among those its selector matches for %s: requests routed to it fail, or (failureMode FailOpen) bypass the picker. Check the selector against the model-server pods (kubectl -n {{ $labels.namespace }} get inferencepool {{ $labels.pool }} -o yaml) and their readiness.' % c.inferencePoolNoReadyEndpointsFor,
            },
          },
        ],
      },
      {
        name: 'gpuledger.ledger',
        rules: [
          {
            alert: 'GpuLedgerGpuAllocatedUnused',
            // A MIG device is allocated and judged on its own (gpu_uuid: its MIG UUID);
            // parent_gpu_uuid names its GPU, and is absent for a whole GPU.
            expr: |||
              max by (%(cl)s, node, namespace, workload, pod, pod_uid, container, gpu_uuid, parent_gpu_uuid) (gpuledger_gpu_allocated_unused{%(sel)s} == 1)
              unless on (%(cl)s, pod_uid)
              (gpuledger_pod_starting{%(sel)s} == 1)
              %(ledgerSourcesUp)s
            ||| % { cl: cl, sel: sel, ledgerSourcesUp: std.rstripChars(ledgerSourcesUp, '\n') },
            'for': c.gpuAllocatedUnusedFor,
            labels: { severity: 'warning', layer: 'ledger' },
            annotations: {
              summary: 'A GPU or MIG device is allocated to a container that does not use it.',
              description: deviceText + ' on node {{ $labels.node }} has been allocated to container {{ $labels.container }} of pod {{ $labels.namespace }}/{{ $labels.pod }} (workload {{ $labels.workload }}) for %s, but no process of that container holds a context on it.' % c.gpuAllocatedUnusedFor,
            },
          },
          {
            alert: 'GpuLedgerGpuUnallocatedUse',
            expr: |||
              max by (%(cl)s, node, namespace, workload, pod, pod_uid, container, gpu_uuid, parent_gpu_uuid) (gpuledger_gpu_unallocated_use{%(sel)s} == 1)
              %(ledgerSourcesUp)s
            ||| % { cl: cl, sel: sel, ledgerSourcesUp: std.rstripChars(ledgerSourcesUp, '\n') },
            'for': c.gpuUnallocatedUseFor,
            labels: { severity: 'warning', layer: 'ledger' },
            annotations: {
              summary: 'A container uses a GPU or MIG device that is not allocated to it.',
              description: 'Container {{ $labels.container }} of pod {{ $labels.namespace }}/{{ $labels.pod }} (workload {{ $labels.workload }}) has been using ' + deviceText + ' on node {{ $labels.node }} for %s without Kubernetes allocating it to that container.' % c.gpuUnallocatedUseFor,
            },
          },
          {
            alert: 'GpuLedgerRayGpusExceedAllocation',
            expr: |||
              max by (%(rkey)s) (gpuledger_ray_node_gpus{%(sel)s, state="total"})
              > on (%(rkey)s)
              max by (%(rkey)s) (gpuledger_ray_node_gpus{%(sel)s, state="allocated"})
              %(ledgerSourcesUp)s
            ||| % {
              rkey: '%s, node, namespace, pod, pod_uid, ray_node_id' % cl,
              sel: sel,
              ledgerSourcesUp: std.rstripChars(ledgerSourcesUp, '\n'),
            },
            'for': c.rayGpusExceedAllocationFor,
            labels: { severity: 'warning', layer: 'ledger' },
            annotations: {
              summary: 'A Ray node advertises more GPUs than Kubernetes allocated to its pod.',
              description: 'Ray node {{ $labels.ray_node_id }} in pod {{ $labels.namespace }}/{{ $labels.pod }} has advertised {{ $value }} logical GPU(s) for %s, but Kubernetes allocated ' % c.rayGpusExceedAllocationFor
                           + '{{ with printf `gpuledger_ray_node_gpus{state="allocated",pod_uid=%q,ray_node_id=%q}` $labels.pod_uid $labels.ray_node_id | query }}{{ . | first | value }}{{ else }}no{{ end }}'
                           + ' GPU(s) to the pod: Ray can schedule GPU actors onto GPUs the pod does not own (double booking).',
            },
          },
        ],
      },
      {
        name: 'gpuledger.exporter',
        rules: [
          {
            alert: 'GpuLedgerExporterDown',
            expr: std.join('\nor\n', exporterDown) + '\n',
            'for': c.exporterDownFor,
            labels: { severity: 'critical', layer: 'exporter' },
            annotations: {
              summary: 'Prometheus cannot scrape a gpuledger exporter, or has none to scrape.',
              // Which of the three: a target (instance), an absent job (job only), or the
              // kube-state-metrics comparison (neither).
              description: (
                '{{ if $labels.instance }}Prometheus has failed to scrape {{ $labels.instance }} (job {{ $labels.job }}) for %(for)s'
                + '{{ else if $labels.job }}Prometheus has had no target of job {{ $labels.job }} for %(for)s: the agent, or the ServiceMonitor/PodMonitor that finds it, is gone'
                + '{{ else }}{{ $value }} node(s) with GPUs (kube-state-metrics capacity or DRA ResourceSlices){{ with $labels.%(cl)s }} in cluster {{ . }}{{ end }} have had no gpuledger node-agent target for %(for)s: the DaemonSet has no pod there'
                + '{{ end }}: the GPUs, pods or pending work it would report are invisible, and their alerts cannot fire.'
              ) % { 'for': c.exporterDownFor, cl: cl },
            },
          },
          {
            alert: 'GpuLedgerSourceDown',
            // Down: gpuledger_source_state{state="down"}. A source that is not configured
            // (no vLLM targets, no Ray address) is state="not_configured" and never fires,
            // though gpuledger_source_up reports it 0 as well. Exporters without
            // gpuledger_source_state: source_up 0 with errors counted (a source that is not
            // configured never counts one).
            expr: sourcesDown('', old=|||
              and on (%(cl)s, job, instance, source)
              sum by (%(cl)s, job, instance, source) (gpuledger_source_errors_total{%(sel)s}) > 0
            ||| % { cl: cl, sel: sel }) + '\n',
            'for': c.sourceDownFor,
            labels: { severity: 'warning', layer: 'exporter' },
            annotations: {
              summary: 'A gpuledger source keeps failing.',
              description: 'Source {{ $labels.source }} of the gpuledger exporter on node {{ $labels.node }} ({{ $labels.instance }}) has failed every fetch for %s' % c.sourceDownFor
                           + '{{ with printf `topk(1, increase(gpuledger_source_errors_total{instance=%q,source=%q}[5m]))` $labels.instance $labels.source | query }} (reason {{ . | first | label "reason" }}){{ end }}'
                           + '; its series are missing until it recovers.',
            },
          },
          {
            alert: 'GpuLedgerSnapshotStale',
            expr: |||
              gpuledger_snapshot_age_seconds{%(sel)s} > %(stale)d
            ||| % { sel: sel, stale: c.snapshotStaleSeconds },
            'for': c.snapshotStaleFor,
            labels: { severity: 'critical', layer: 'exporter' },
            annotations: {
              summary: "The gpuledger exporter's snapshot is stale.",
              description: 'The gpuledger exporter on node {{ $labels.node }} ({{ $labels.instance }}) serves a snapshot {{ $value | humanizeDuration }} old, older than %ds for %s: its collection loop is stuck, and every gpuledger series from it is frozen.' % [c.snapshotStaleSeconds, c.snapshotStaleFor],
            },
          },
        ],
      },
    ],
  },
}
