// Startup layer: placed, but not serving.
local f = import 'fixtures.libsonnet';
local t = import 'lib.libsonnet';
local c = t.config;

// The next step follows the reason, which the alert reads from the rules.
local startingAlert(workload, reason) = t.alert(
  'GpuLedgerWorkloadStartingTooLong',
  { namespace: 'ml', workload: workload },
  'Workload ml/%s has been starting for %s: its pods are placed on nodes, but GPU containers are not ready or vLLM engines do not answer.' % [workload, c.workloadStartingFor]
  + t.nextStep('starting', reason),
);

t.file([
  // Still downloading weights: the GPU is allocated and not opened yet. That is startup,
  // not a ledger problem, and the engine's partial GPU set is no parallelism mismatch.
  t.scenario(
    'model loading',
    f.startingPod('summarize-a', workload='summarize')
    + f.engine('summarize-a', workload='summarize', up=0, tp=2, gpus=['GPU-s1'])
    + f.allocation('summarize-a', ['GPU-s1', 'GPU-s2'])
    + f.ledgerFlag('gpuledger_gpu_allocated_unused', 'summarize-a', 'GPU-s2', workload='summarize')
    + f.sources(),
    fires=[startingAlert('summarize', 'pod_not_ready')],
    stages={ 'ml/summarize': 'starting:pod_not_ready' },
  ),

  // Containers Ready, but the engine does not answer (crash loop, wrong port).
  t.scenario(
    'engine not up after the pod is ready',
    f.engine('summarize-a', workload='summarize', up=0, gpus=['GPU-s1'])
    + f.engine('summarize-b', workload='summarize', running=2, gpus=['GPU-s2']),
    fires=[startingAlert('summarize', 'engine_not_up')],
    stages={ 'ml/summarize': 'starting:engine_not_up' },
    exprs=[
      t.expr('namespace_workload:gpuledger_engine_up:sum', { 'namespace_workload:gpuledger_engine_up:sum{namespace="ml",workload="summarize"}': 1 }),
      t.expr('namespace_workload:gpuledger_engine_up:count', { 'namespace_workload:gpuledger_engine_up:count{namespace="ml",workload="summarize"}': 2 }),
    ],
  ),
])
