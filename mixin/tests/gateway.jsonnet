// The gateway (Gateway API Inference Extension): requests an InferencePool's endpoint
// picker holds while the pool's engines have headroom page the routing layer
// (GpuLedgerGatewayQueueing), never the engine layer; engines that queue behind a picker
// that passes requests straight through page the engine layer only; a pool with no ready
// endpoint pages the routing layer for the pool (GpuLedgerInferencePoolNoReadyEndpoints).
// The same three-engine pool as tests/fixtures/scenarios/gateway-*.yaml.
local f = import 'fixtures.libsonnet';
local t = import 'lib.libsonnet';
local c = t.config;

local pods = ['vllm-a-x', 'vllm-a-y', 'vllm-a-z'];
local engines(waiting, running) = std.flattenArrays([
  f.engine(pod, namespace='llm', workload='vllm-a', waiting=waiting, running=running, kv=0.4, maxNumSeqs=8, gpus=['GPU-' + pod])
  for pod in pods
]);
local pool(queued, ready=[true, true, true]) =
  f.inferencePool('pool-a', [[pods[i], 'vllm-a', ready[i]] for i in std.range(0, 2)], namespace='llm', queued=queued, ready=3, saturation=0.2);
local engineText(pod) = 'engine 0 (model llama-3-8b, target %s:8000) in pod llm/%s of workload vllm-a' % [pod, pod];

t.file([
  // The picker holds 30 while every engine runs 4 of max_num_seqs 8: the gateway holds
  // them, the routing layer is paged.
  t.scenario(
    'Picker queue while the engines have headroom: the gateway alert only',
    pool(30) + engines(0, 4) + f.sources(),
    fires=[
      t.alert(
        'GpuLedgerGatewayQueueing',
        { namespace: 'llm', workload: 'vllm-a' },
        '30 request(s) for workload llm/vllm-a have been held by the endpoint picker of its InferencePool(s) for %s while no engine of the workload queues and 3 engine(s) have headroom: the requests wait in the gateway.' % c.gatewayQueueingFor
        + t.nextStep('routing', 'gateway_queue'),
      ),
    ],
    stages={ 'llm/vllm-a': 'routing:gateway_queue' },
    exprs=[
      t.expr('namespace_workload:gpuledger_gateway_queued_requests:sum', {
        'namespace_workload:gpuledger_gateway_queued_requests:sum{namespace="llm",workload="vllm-a"}': 30,
      }),
    ],
  ),

  // The picker passes requests straight through and the engines queue at max_num_seqs:
  // engine queueing, the engine alert only.
  t.scenario(
    'Picker passing through to engines at max_num_seqs: the engine alert only',
    pool(0) + engines(10, 8) + f.sources(),
    fires=[
      t.alert(
        'GpuLedgerEngineQueueingAtMaxNumSeqs',
        f.engineKey(pod, namespace='llm', workload='vllm-a') { max_num_seqs: '8' },
        '10 request(s) have been waiting in %s for %s while it runs max_num_seqs=8 requests and its KV cache is below %g%%: the max_num_seqs setting, not memory, bounds the batch, and no sibling engine has headroom.'
        % [engineText(pod), c.engineMaxNumSeqsFor, c.kvCacheHeadroomRatio * 100]
        + t.nextStep('engine_queueing', 'max_num_seqs'),
      )
      for pod in pods
    ],
    stages={ 'llm/vllm-a': 'engine_queueing:max_num_seqs' },
  ),

  // The picker holds requests and the engines queue too: the engines bound it, the engine
  // alert pages and the gateway is not paged.
  t.scenario(
    'Picker queue while the engines queue: the engine alert only',
    pool(30) + engines(10, 8) + f.sources(),
    fires=[
      t.alert(
        'GpuLedgerEngineQueueingAtMaxNumSeqs',
        f.engineKey(pod, namespace='llm', workload='vllm-a') { max_num_seqs: '8' },
        '10 request(s) have been waiting in %s for %s while it runs max_num_seqs=8 requests and its KV cache is below %g%%: the max_num_seqs setting, not memory, bounds the batch, and no sibling engine has headroom.'
        % [engineText(pod), c.engineMaxNumSeqsFor, c.kvCacheHeadroomRatio * 100]
        + t.nextStep('engine_queueing', 'max_num_seqs'),
      )
      for pod in pods
    ],
    stages={ 'llm/vllm-a': 'engine_queueing:max_num_seqs' },
  ),

  // Every engine full (running = max_num_seqs), none queues, the picker holds the rest:
  // the pool is saturated; said (routing, gateway_saturated), nobody is paged for it.
  t.scenario(
    'Picker queue in front of a saturated pool: said, not paged',
    pool(30) + engines(0, 8) + f.sources(),
    stages={ 'llm/vllm-a': 'routing:gateway_saturated' },
  ),

  // Flow control off (no queue series): the picker holds nothing, the engines idle.
  t.scenario(
    'Picker without flow control',
    pool(null) + engines(0, 0) + f.sources(),
    stages={ 'llm/vllm-a': 'idle' },
  ),

  // A pool whose selector matches no pod, and one whose only pod is not Ready: both have
  // no ready endpoint. The pool is paged for, not a workload.
  t.scenario(
    'Pools without a ready endpoint',
    f.inferencePool('pool-empty', [], namespace='llm', queued=0)
    + f.inferencePool('pool-down', [['vllm-down-0', 'vllm-down', false]], namespace='llm', queued=0)
    + f.sources(),
    fires=[
      t.alert(
        'GpuLedgerInferencePoolNoReadyEndpoints',
        { namespace: 'llm', pool: p },
        'InferencePool llm/%s has had no Ready pod among those its selector matches for %s: requests routed to it fail, or (failureMode FailOpen) bypass the picker. Check the selector against the model-server pods (kubectl -n llm get inferencepool %s -o yaml) and their readiness.' % [p, c.inferencePoolNoReadyEndpointsFor, p],
      )
      for p in ['pool-down', 'pool-empty']
    ],
    stages={ 'llm/vllm-down': 'no_engine' },
  ),
])
