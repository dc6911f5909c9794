// Exporter layer: gpuledger itself.
local f = import 'fixtures.libsonnet';
local t = import 'lib.libsonnet';
local c = t.config;

local blind = ': the GPUs, pods or pending work it would report are invisible, and their alerts cannot fire.';
local node2 = t.nodeTarget { instance: '10.0.0.12:9402' };
local sourceDown(source) = t.alert(
  'GpuLedgerSourceDown',
  f.nodeExporter { source: source },
  'Source %s of the gpuledger exporter on node gpu-node-1 (10.0.0.11:9402) has failed every fetch for %s (reason timeout); its series are missing until it recovers.' % [source, c.sourceDownFor],
);

// kube-state-metrics' node capacity: `resources` {resource: count} of one node.
local capacity(node, resources) = [
  t.gauge('kube_node_status_capacity', { job: 'kube-state-metrics', instance: '10.0.0.9:8080', node: node, resource: r, unit: 'integer' }, resources[r])
  for r in std.objectFields(resources)
];
// Three nodes with GPUs (one of them only MIG devices), a node whose GPU resource reads 0
// (the device plugin is not up yet) and a CPU node.
local cluster =
  capacity('gpu-node-1', { cpu: 128, nvidia_com_gpu: 8 })
  + capacity('gpu-node-2', { cpu: 128, nvidia_com_gpu: 8 })
  + capacity('gpu-node-3', { cpu: 128, nvidia_com_gpu: 0, nvidia_com_mig_1g_10gb: 14 })
  + capacity('gpu-node-4', { cpu: 128, nvidia_com_gpu: 0 })
  + capacity('cpu-node-1', { cpu: 64 });

// The cluster view's count of GPU devices in a node's DRA ResourceSlices (`dra_node`; `node`
// is the cluster agent's own, as on every gpuledger series).
local draNode(node, devices) = t.gauge(
  'gpuledger_dra_node_gpu_devices',
  t.clusterTarget { node: 'gpuledger-cluster-0', dra_node: node, dra_driver_name: 'gpu.nvidia.com' },
  devices,
);
// GPU nodes 1 and 2 by capacity; dra-node-1 has no GPU capacity, its GPUs only DRA
// publishes; gpu-node-1 runs the DRA driver too (one node, counted once).
local draCluster =
  capacity('gpu-node-1', { cpu: 128, nvidia_com_gpu: 8 })
  + capacity('gpu-node-2', { cpu: 128, nvidia_com_gpu: 8 })
  + capacity('dra-node-1', { cpu: 128 })
  + [draNode('dra-node-1', 4), draNode('gpu-node-1', 8)];
local missing(n) =
  '%d node(s) with GPUs (kube-state-metrics capacity or DRA ResourceSlices) have had no gpuledger node-agent target for %s: the DaemonSet has no pod there' % [n, c.exporterDownFor] + blind;

t.file([
  t.scenario(
    'exporter down',
    [
      t.gauge('up', node2, 0),
      t.gauge('up', t.nodeTarget, 1),
      t.gauge('up', t.clusterTarget, 1),
      // Not gpuledger: not ours to report.
      t.gauge('up', { job: 'node-exporter', instance: '10.0.0.12:9100' }, 0),
    ],
    fires=[
      t.alert(
        'GpuLedgerExporterDown',
        node2,
        'Prometheus has failed to scrape 10.0.0.12:9402 (job gpuledger-node) for %s' % c.exporterDownFor + blind,
      ),
    ],
  ),

  // The DaemonSet (or its ServiceMonitor) is deleted at minute 5: its targets vanish, and
  // Prometheus marks their series stale. No target fails, none is left.
  t.scenario(
    'node agents vanish',
    [
      t.gauge('up', t.clusterTarget, 1),
      { series: 'up{instance="10.0.0.11:9402",job="gpuledger-node"}', values: '1x4 stale' },
      { series: 'up{instance="10.0.0.12:9402",job="gpuledger-node"}', values: '1x4 stale' },
    ],
    after=5,
    fires=[
      t.alert(
        'GpuLedgerExporterDown',
        { job: 'gpuledger-node' },
        'Prometheus has had no target of job gpuledger-node for %s: the agent, or the ServiceMonitor/PodMonitor that finds it, is gone' % c.exporterDownFor + blind,
      ),
    ],
  ),

  t.scenario(
    'cluster view vanishes',
    [
      t.gauge('up', t.nodeTarget, 1),
      { series: 'up{instance="10.0.0.5:9402",job="gpuledger-cluster"}', values: '1x4 stale' },
    ],
    after=5,
    fires=[
      t.alert(
        'GpuLedgerExporterDown',
        { job: 'gpuledger-cluster' },
        'Prometheus has had no target of job gpuledger-cluster for %s: the agent, or the ServiceMonitor/PodMonitor that finds it, is gone' % c.exporterDownFor + blind,
      ),
    ],
  ),

  // kube-state-metrics knows 3 nodes with GPUs; the DaemonSet has pods on 2 of them.
  t.scenario(
    'fewer node agents than GPU nodes',
    cluster + [
      t.gauge('up', t.nodeTarget, 1),
      t.gauge('up', node2, 1),
      t.gauge('up', t.clusterTarget, 1),
    ],
    fires=[
      t.alert(
        'GpuLedgerExporterDown',
        {},
        missing(1),
      ),
    ],
  ),

  t.scenario(
    'a node agent on every GPU node: silent',
    cluster + [
      t.gauge('up', t.nodeTarget, 1),
      t.gauge('up', node2, 1),
      t.gauge('up', t.nodeTarget { instance: '10.0.0.13:9402' }, 1),
      t.gauge('up', t.clusterTarget, 1),
    ],
  ),

  // Three GPU nodes, one of them DRA-only (no nvidia.com/gpu capacity): two agents are one
  // short. gpu-node-1, known to both, counts once (else 4 - 2 = 2).
  t.scenario(
    'fewer node agents than GPU nodes, one of them DRA-only',
    draCluster + [
      t.gauge('up', t.nodeTarget, 1),
      t.gauge('up', node2, 1),
      t.gauge('up', t.clusterTarget, 1),
    ],
    fires=[t.alert('GpuLedgerExporterDown', {}, missing(1))],
  ),

  t.scenario(
    'a node agent on every GPU node, one of them DRA-only: silent',
    draCluster + [
      t.gauge('up', t.nodeTarget, 1),
      t.gauge('up', node2, 1),
      t.gauge('up', t.nodeTarget { instance: '10.0.0.13:9402' }, 1),
      t.gauge('up', t.clusterTarget, 1),
    ],
  ),

  // No kube-state-metrics at all: the ResourceSlices alone say which nodes have GPUs.
  t.scenario(
    'DRA-only cluster without kube-state-metrics, an agent short',
    [
      draNode('dra-node-1', 4),
      draNode('dra-node-2', 2),
      t.gauge('up', t.nodeTarget, 1),
      t.gauge('up', t.clusterTarget, 1),
    ],
    fires=[t.alert('GpuLedgerExporterDown', {}, missing(1))],
  ),

  // No node agent at all: absent() says so, once; the comparison stays out of it.
  t.scenario(
    'no node agent, kube-state-metrics knows GPU nodes: one alert',
    cluster + [t.gauge('up', t.clusterTarget, 1)],
    targets=false,
    fires=[
      t.alert(
        'GpuLedgerExporterDown',
        { job: 'gpuledger-node' },
        'Prometheus has had no target of job gpuledger-node for %s: the agent, or the ServiceMonitor/PodMonitor that finds it, is gone' % c.exporterDownFor + blind,
      ),
    ],
  ),

  // gpuledger_source_state{state="down"} == 1, next to sources that are not configured.
  t.scenario(
    'source down',
    f.sources(down=['vllm'], disabled=['ray']),
    fires=[sourceDown('vllm')],
  ),

  // An exporter from before gpuledger_source_state: source_up 0 with errors counted.
  t.scenario(
    'source down, exporter without gpuledger_source_state',
    f.sources(down=['vllm'], state=false),
    fires=[sourceDown('vllm')],
  ),

  // Not configured (no vLLM targets, no Ray address): source_up 0 too, but the state set
  // says not_configured, and that never fires.
  t.scenario(
    'sources not configured: silent',
    f.sources(disabled=['vllm', 'ray']),
  ),

  // Even with an error counted for it: the state decides, not source_up or the errors.
  t.scenario(
    'source not configured, with errors counted: silent',
    f.sources(disabled=['vllm', 'ray'])
    + [t.counter('gpuledger_source_errors_total', f.nodeExporter { source: 'vllm', reason: 'timeout' }, 6, start=1)],
  ),

  // Before gpuledger_source_state: source_up 0 and no error is a source not configured.
  t.scenario(
    'sources not configured, exporter without gpuledger_source_state: silent',
    f.sources(disabled=['vllm', 'ray'], state=false),
  ),

  t.scenario(
    'snapshot stale',
    [t.gauge('gpuledger_snapshot_age_seconds', f.nodeExporter, 300)] + f.sources(),
    fires=[
      t.alert(
        'GpuLedgerSnapshotStale',
        f.nodeExporter,
        'The gpuledger exporter on node gpu-node-1 (10.0.0.11:9402) serves a snapshot 5m 0s old, older than %ds for %s: its collection loop is stuck, and every gpuledger series from it is frozen.' % [c.snapshotStaleSeconds, c.snapshotStaleFor],
      ),
    ],
  ),

  t.scenario(
    'fresh snapshot, all sources up: silent',
    [t.gauge('gpuledger_snapshot_age_seconds', f.nodeExporter, 3), t.gauge('up', f.nodeExporter, 1)] + f.sources(),
  ),
])
