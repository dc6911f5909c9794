// Ray Serve: requests held at a Serve router page the routing layer (GpuLedgerServeRouterQueueing),
// never while an engine of the workload queues (that is the engine layer's), and nothing
// pages once the router drains.
local f = import 'fixtures.libsonnet';
local t = import 'lib.libsonnet';
local c = t.config;

local replicas(ongoing) = [['serve-llm-worker-a', 'q3xk7a1m', ongoing], ['serve-llm-worker-b', 'v9d2m5pz', ongoing]];
local deployment(queued, ongoing) =
  f.serveDeployment('llm', 'LLMServer', queued, atReplicas=2 * ongoing, replicas=replicas(ongoing), workload='serve-llm', maxOngoing=32);
local engines(waiting, kv) = std.flattenArrays([
  f.engine(pod, namespace='ray', workload='serve-llm', waiting=waiting, running=8, kv=kv, maxNumSeqs=256, gpus=['GPU-' + pod])
  for pod in ['serve-llm-worker-a', 'serve-llm-worker-b']
]);
local engineText(pod) = 'engine 0 (model llama-3-8b, target %s:8000) in pod ray/%s of workload serve-llm' % [pod, pod];

t.file([
  // 30 requests wait at the proxy's router; the replicas run one each and their engines
  // have room: the routing layer holds them.
  t.scenario(
    'Serve router queue while the replicas idle',
    deployment(30, 1) + engines(0, 0.1) + f.sources(),
    fires=[
      t.alert(
        'GpuLedgerServeRouterQueueing',
        { namespace: 'ray', workload: 'serve-llm', application: 'llm', deployment: 'LLMServer' },
        '30 request(s) for Ray Serve deployment llm/LLMServer of workload ray/serve-llm have been waiting at its router for %s, not assigned to a replica, while no engine of the workload queues: the replicas are at max_ongoing_requests or the router cannot reach them.' % c.serveRouterQueueingFor
        + t.nextStep('routing', 'serve_router_queue'),
      ),
    ],
    stages={ 'ray/serve-llm': 'routing:serve_router_queue' },
    exprs=[
      t.expr('namespace_workload_application_deployment:gpuledger_serve_router_queued_requests:sum', {
        'namespace_workload_application_deployment:gpuledger_serve_router_queued_requests:sum{application="llm",deployment="LLMServer",namespace="ray",workload="serve-llm"}': 30,
      }),
    ],
  ),

  // A Serve deployment without vLLM engines (the capture's Sleeper): the router queue alone.
  t.scenario(
    'Serve router queue of a deployment without engines',
    deployment(30, 5) + f.sources(),
    fires=[
      t.alert(
        'GpuLedgerServeRouterQueueing',
        { namespace: 'ray', workload: 'serve-llm', application: 'llm', deployment: 'LLMServer' },
        '30 request(s) for Ray Serve deployment llm/LLMServer of workload ray/serve-llm have been waiting at its router for %s, not assigned to a replica, while no engine of the workload queues: the replicas are at max_ongoing_requests or the router cannot reach them.' % c.serveRouterQueueingFor
        + t.nextStep('routing', 'serve_router_queue'),
      ),
    ],
    stages={ 'ray/serve-llm': 'routing:serve_router_queue' },
  ),

  // The engines queue too: the requests wait for KV cache, the engine alert pages and the
  // routing layer is not paged.
  t.scenario(
    'Serve router queue while the engines queue: the engine alert only',
    deployment(30, 20) + engines(12, 0.95) + f.sources(),
    fires=[
      t.alert(
        'GpuLedgerEngineQueueingKvCachePressure',
        f.engineKey(pod, namespace='ray', workload='serve-llm'),
        'Requests have been waiting in %s for %s with its KV cache 95%% full, and no sibling engine has headroom.' % [engineText(pod), c.engineKvCachePressureFor]
        + t.nextStep('engine_queueing', 'kv_cache'),
      )
      for pod in ['serve-llm-worker-a', 'serve-llm-worker-b']
    ],
    stages={ 'ray/serve-llm': 'engine_queueing:kv_cache' },
  ),

  // Drained: nothing waits anywhere, nothing fires.
  t.scenario(
    'Serve router drained',
    deployment(0, 0) + engines(0, 0.05) + f.sources(),
    stages={ 'ray/serve-llm': 'serving' },
  ),
])
