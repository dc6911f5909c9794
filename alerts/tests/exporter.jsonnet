// Exporter layer: gpuledger itself.
local f = import 'fixtures.libsonnet';
local t = import 'lib.libsonnet';
local c = t.config;

t.file([
  t.scenario(
    'exporter down',
    [
      t.gauge('up', { job: 'gpuledger', instance: '10.0.0.12:9402' }, 0),
      t.gauge('up', { job: 'gpuledger', instance: '10.0.0.11:9402' }, 1),
      t.gauge('up', { job: 'gpuledger-cluster', instance: '10.0.0.5:9402' }, 1),
      // Not gpuledger: not ours to report.
      t.gauge('up', { job: 'node-exporter', instance: '10.0.0.12:9100' }, 0),
    ],
    fires=[
      t.alert(
        'GpuLedgerExporterDown',
        { job: 'gpuledger', instance: '10.0.0.12:9402' },
        'Prometheus has failed to scrape 10.0.0.12:9402 (job gpuledger) for %s: the GPUs, pods or pending work it reports are invisible, and their alerts cannot fire.' % c.exporterDownFor,
      ),
    ],
  ),

  t.scenario(
    'source down',
    f.sources(down=['vllm']),
    fires=[
      t.alert(
        'GpuLedgerSourceDown',
        f.nodeExporter { source: 'vllm' },
        'Source vllm of the gpuledger exporter on node gpu-node-1 (10.0.0.11:9402) has failed every fetch for %s (reason timeout); its series are missing until it recovers.' % c.sourceDownFor,
      ),
    ],
  ),

  // Not configured (no vLLM targets, no Ray address): reported 0, but nothing fails.
  t.scenario(
    'disabled sources: silent',
    f.sources(disabled=['vllm', 'ray']),
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
