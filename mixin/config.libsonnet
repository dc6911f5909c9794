// Every selector, threshold and `for` of the gpuledger mixin.
//
// Override any of these from your own jsonnet:
//
//   (import 'gpuledger-mixin/mixin.libsonnet') + {
//     _config+:: { gpuledgerSelector: 'job="gpu-ledger"', kvCachePressureRatio: 0.95 },
//   }
//
// Rules, alerts, their promtool tests and the dashboards all read these values, so the
// rendered tests keep testing both sides of each `for:` after a change (scripts/render-mixin).
//
// The workload stages, their precedence and reasons, and the defaults of the thresholds
// below come from lib/stages.json: a copy of the exporter's exporter/gpuledger/stages.json,
// the file `gpuledger explain` and the /ledger page judge by, written by
// scripts/render-mixin so that this folder renders on its own (jsonnet-bundler vendors only
// it). The recording rules and explain agree by construction
// (tests/mixin/test_stage_differential.py checks it on real expositions).
local stages = import 'lib/stages.json';

{
  // Stage definitions (stages.json): rules, alerts and dashboards read them from here.
  _stages:: stages,

  _config+:: {
    // ---------------------------------------------------------------- selectors

    // Matches every gpuledger scrape job: the node-mode DaemonSet and the cluster-mode
    // Deployment. Every raw `gpuledger_*` series in rules and dashboards uses it.
    gpuledgerSelector: 'job=~"gpuledger.*"',

    // The two agents a cluster runs, as selectors of their scrape targets: the node-mode
    // DaemonSet and the cluster-mode Deployment (the Helm chart's jobs are <jobName>-node
    // and <jobName>-cluster). Both must fall under gpuledgerSelector. GpuLedgerExporterDown
    // fires while Prometheus has no target of one of them at all (`absent(up{...})`: the
    // DaemonSet, the Deployment or its ServiceMonitor/PodMonitor is gone), not only while a
    // target fails. Use equality matchers: absent() labels its series with those only. ''
    // where that agent is not deployed (no cluster-mode Deployment, say). absent() sees the
    // whole Prometheus: with several clusters in one, a cluster that lost its agents shows
    // only through the kube-state-metrics comparison below.
    gpuledgerNodeSelector: 'job="gpuledger-node"',
    gpuledgerClusterSelector: 'job="gpuledger-cluster"',

    // Optional: kube-state-metrics, whose kube_node_status_capacity says which nodes have
    // GPUs. GpuLedgerExporterDown also fires, per cluster, while fewer node-agent targets
    // (gpuledgerNodeSelector) exist than GPU nodes: nodes with a GPU resource matching
    // gpuNodeResourceRegex, or whose DRA ResourceSlices publish GPU devices (the cluster
    // view's gpuledger_dra_node_gpu_devices: a DRA-only node has no GPU capacity, and
    // kube-state-metrics no ResourceSlice series). A DaemonSet pod that is not scheduled
    // (taints, resources, a node selector) has no target to fail. With neither series the
    // comparison finds nothing and stays silent. '' turns the whole comparison off (for a
    // DaemonSet that skips some GPU nodes on purpose).
    kubeStateMetricsSelector: 'job="kube-state-metrics"',
    // kube-state-metrics' `resource` label of GPUs in node capacity: nvidia.com/gpu, and the
    // MIG devices of the mixed strategy (nvidia.com/mig-1g.10gb, ...).
    gpuNodeResourceRegex: 'nvidia_com_gpu|nvidia_com_mig_.+',

    // Label that tells clusters apart when several send to one Prometheus (Thanos,
    // Mimir, federation). Rules always aggregate by it; a missing label is harmless.
    clusterLabel: 'cluster',

    // Show the cluster variable on the dashboards and filter every query on it.
    showMultiCluster: false,

    // Sources whose failure makes the GPU ledger incomplete on a node: while one of them
    // is down there, the ledger alerts of that node stay silent (GpuLedgerSourceDown
    // fires instead). A regex over the `source` label.
    ledgerSourcesRegex: 'nvml|procfs|podresources',

    // ---------------------------------------------------------------- thresholds

    // The defaults come from lib/stages.json (the exporter's stages.json), whose values `gpuledger
    // explain` and the /ledger page use. An override here changes the mixin only: near
    // that threshold the rules then judge a workload differently from explain.

    // An engine is "queueing" when at least this many requests wait in it. The workload
    // stage is `engine_queueing` (or `routing`) when at least one of its engines queues.
    queueingMinWaitingRequests: stages.thresholds.queueingMinWaitingRequests,

    // KV-cache usage (0-1) at or above which a queueing engine is memory-bound.
    kvCachePressureRatio: stages.thresholds.kvCachePressureRatio,

    // KV-cache usage (0-1) below which an engine has KV headroom: a queueing engine
    // below it at max_num_seqs is bound by that setting, and a non-queueing engine below
    // it (and below max_num_seqs) can take load from a queueing sibling.
    kvCacheHeadroomRatio: stages.thresholds.kvCacheHeadroomRatio,

    // Seconds after which the exporter's snapshot counts as stale. The collection loop
    // renews it every --interval (10s by default).
    snapshotStaleSeconds: 120,

    // ---------------------------------------------------------------- for
    // How long a condition must hold before its alert fires. Whole minutes: the rendered
    // promtool tests evaluate one minute before and exactly at each of them.

    // GPU pods of a workload unplaced (Kubernetes `PodScheduled=False`).
    podsPendingPlacementFor: '10m',
    // Ray placement groups that can never fit (`INFEASIBLE`). Will not resolve itself.
    rayPlacementGroupsInfeasibleFor: '5m',
    // Ray placement groups waiting for resources (`NO_RESOURCES`).
    rayPlacementGroupsWaitingFor: '15m',
    // Workload placed but not serving: pods starting or engines not up. Loading a large
    // model takes minutes; keep this above your slowest cold start.
    workloadStartingFor: '20m',
    // Engine queueing with its KV cache at or above kvCachePressureRatio.
    engineKvCachePressureFor: '10m',
    // Engine queueing at max_num_seqs with KV headroom.
    engineMaxNumSeqsFor: '10m',
    // Some engines of a workload queue while a sibling has headroom.
    routingImbalanceFor: '10m',
    // A Ray Serve router holds requests for a deployment while no engine of the workload
    // queues (stage routing, reason serve_router_queue).
    serveRouterQueueingFor: '10m',
    // The endpoint picker of a workload's InferencePool holds requests while an engine
    // of the workload has headroom (stage routing, reason gateway_queue).
    gatewayQueueingFor: '5m',
    // An InferencePool whose selector matches no Ready pod: the gateway has nowhere to
    // send its requests.
    inferencePoolNoReadyEndpointsFor: '5m',
    // Engine up, its processes hold a GPU count other than tensor x pipeline parallel.
    engineParallelismMismatchFor: '15m',
    // GPU allocated to a container that no process of it uses (after startup).
    gpuAllocatedUnusedFor: '30m',
    // GPU used by a container it is not allocated to.
    gpuUnallocatedUseFor: '10m',
    // Ray node advertises more logical GPUs than Kubernetes allocated to its pod.
    rayGpusExceedAllocationFor: '10m',
    // Prometheus cannot scrape a gpuledger target, or has none of an expected agent.
    exporterDownFor: '10m',
    // A gpuledger source keeps failing.
    sourceDownFor: '10m',
    // The exporter's snapshot is older than snapshotStaleSeconds.
    snapshotStaleFor: '5m',

    // ---------------------------------------------------------------- deprecations

    // Until this release the recording rules were named gpuledger:<what>:<aggregation>; they
    // are now level:metric:operations (docs/mixin.md, "Recording rule names"). true: one
    // more rule group (gpuledger.deprecated_aliases, rules/aliases.libsonnet) records every
    // old name from the new one, with the same labels and values, so dashboards, alerts and
    // queries of your own that use the old names keep working while you move them. Nothing
    // of the mixin reads the old names. false: no aliases (and ~25 fewer rules to evaluate).
    // Deprecated: the aliases and this setting will be removed in the next release.
    deprecatedRecordingRuleAliases: true,

    // ---------------------------------------------------------------- links

    // Every alert gets `runbook_url: <this % lower-case alert name>`, the anchor of its
    // section in gpuledger's docs/runbooks.md (alerts/add-runbook-links.libsonnet).
    //
    // Set this to an address your on-call can open. Every gpuledger agent serves the
    // runbooks of its version at /runbooks#<alert>, so point it at the cluster agent
    // behind your Ingress or proxy ('https://gpuledger.example.com/runbooks#%s'), or at
    // your own copy of docs/runbooks.md ('https://git.example.com/.../runbooks.md#%s').
    // The default is that page on the port-forward docs/install.md uses
    // (`kubectl -n gpuledger port-forward svc/gpuledger-cluster 9402`): it works as soon
    // as that runs, and names a runbook that ships with the mixin. There is no public copy
    // to link to. The Helm chart's PrometheusRule can set it too
    // (prometheusRule.runbookURLPattern).
    runbookURLPattern: 'http://localhost:9402/runbooks#%s',

    // ---------------------------------------------------------------- dashboards

    dashboardTags: ['gpuledger'],
    // Stable dashboard uids: links and bookmarks survive re-imports.
    dashboardUids: {
      waiting: 'gpuledger-where-waiting',
      ledger: 'gpuledger-gpu-ledger',
      engines: 'gpuledger-engines',
      ray: 'gpuledger-ray',
    },
    dashboardRefresh: '30s',
    dashboardTimeFrom: 'now-3h',
    // Empty: the viewer's browser time zone.
    dashboardTimezone: '',
  },
}
