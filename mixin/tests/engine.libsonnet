// Engine and routing layers, plus healthy and idle workloads that must stay silent.
local f = import 'fixtures.libsonnet';
local t = import 'lib.libsonnet';
local c = t.config;

local engineText(pod, workload='chat', model='llama-3-8b', target=null) =
  'engine 0 (model %s, target %s) in pod ml/%s of workload %s'
  % [model, if target == null then pod + ':8000' else target, pod, workload];

// One pod, two scrape targets (two API servers, or two endpoints of one), serving the same
// model at the same data-parallel rank: two engines, told apart by `target` only.
local targetA = '10.42.0.7:8000';
local targetB = '10.42.0.7:8001';
local twoTargetKey(target) = f.engineKey('chat-a', target=target);
local twoTargetSeries(rule, target) =
  rule + '{engine="0",model_name="llama-3-8b",namespace="ml",node="gpu-node-1",pod="chat-a",pod_uid="uid-chat-a",target="%s",workload="chat"}' % target;

{
  // Shared with paired.jsonnet: the same engines, with and without a placement problem.
  kvPressureEngines::
    f.engine('chat-a', waiting=4, running=6, kv=0.95, gpus=['GPU-a'], preemptionsPerMinute=3)
    + f.engine('chat-b', waiting=2, running=6, kv=0.97, gpus=['GPU-b'], preemptionsPerMinute=1),
  kvPressureAlerts:: [
    t.alert(
      'GpuLedgerEngineQueueingKvCachePressure',
      f.engineKey('chat-a'),
      'Requests have been waiting in %s for %s with its KV cache 95%% full, and no sibling engine has headroom.' % [engineText('chat-a'), c.engineKvCachePressureFor]
      + t.nextStep('engine_queueing', 'kv_cache'),
    ),
    t.alert(
      'GpuLedgerEngineQueueingKvCachePressure',
      f.engineKey('chat-b'),
      'Requests have been waiting in %s for %s with its KV cache 97%% full, and no sibling engine has headroom.' % [engineText('chat-b'), c.engineKvCachePressureFor]
      + t.nextStep('engine_queueing', 'kv_cache'),
    ),
  ],

  maxNumSeqsEngines::
    f.engine('chat-a', waiting=5, running=8, kv=0.4, maxNumSeqs=8, gpus=['GPU-a'])
    + f.engine('chat-b', waiting=3, running=8, kv=0.45, maxNumSeqs=8, gpus=['GPU-b']),
  local maxNumSeqsAlert(pod, waiting) = t.alert(
    'GpuLedgerEngineQueueingAtMaxNumSeqs',
    f.engineKey(pod) { max_num_seqs: '8' },
    '%d request(s) have been waiting in %s for %s while it runs max_num_seqs=8 requests and its KV cache is below %g%%: the max_num_seqs setting, not memory, bounds the batch, and no sibling engine has headroom.'
    % [waiting, engineText(pod), c.engineMaxNumSeqsFor, c.kvCacheHeadroomRatio * 100]
    + t.nextStep('engine_queueing', 'max_num_seqs'),
  ),
  maxNumSeqsAlerts:: [maxNumSeqsAlert('chat-a', 5), maxNumSeqsAlert('chat-b', 3)],

  // chat-a is full and queues; chat-b, its sibling, is nearly empty.
  stickyRoutingEngines::
    f.engine('chat-a', waiting=12, running=8, kv=0.5, maxNumSeqs=8, gpus=['GPU-a'])
    + f.engine('chat-b', waiting=0, running=1, kv=0.05, maxNumSeqs=8, gpus=['GPU-b']),
  stickyRoutingAlerts:: [
    t.alert(
      'GpuLedgerRoutingImbalance',
      { namespace: 'ml', workload: 'chat' },
      '1 engine(s) of workload ml/chat have had requests waiting for %s while 1 sibling engine(s) have headroom: requests are not spread over the replicas.' % c.routingImbalanceFor
      + t.nextStep('routing', 'imbalance'),
    ),
  ],

  // An SGLang engine (qwen) beside a serving vLLM engine (chat).
  sglangBesideVllm(waiting, running, kv)::
    f.engine('qwen-a', workload='qwen', model='qwen', waiting=waiting, running=running, kv=kv, maxNumSeqs=4, gpus=['GPU-q0', 'GPU-q1'], tp=2, kind='sglang')
    + f.engine('chat-a', waiting=0, running=3, kv=0.3, maxNumSeqs=256, gpus=['GPU-a']),

  tests:: [
    // Issue 25: an SGLang engine (TP 2, its --max-running-requests is max_num_seqs, no
    // waiting-by-reason series) beside a vLLM engine that serves, in another workload:
    // the rules treat both kinds alike.
    t.scenario(
      'an SGLang engine at --max-running-requests with KV room, beside a serving vLLM engine',
      $.sglangBesideVllm(40, 4, 0.3),
      fires=[
        t.alert(
          'GpuLedgerEngineQueueingAtMaxNumSeqs',
          f.engineKey('qwen-a', workload='qwen', model='qwen') { max_num_seqs: '4' },
          '40 request(s) have been waiting in %s for %s while it runs max_num_seqs=4 requests and its KV cache is below %g%%: the max_num_seqs setting, not memory, bounds the batch, and no sibling engine has headroom.'
          % [engineText('qwen-a', workload='qwen', model='qwen'), c.engineMaxNumSeqsFor, c.kvCacheHeadroomRatio * 100]
          + t.nextStep('engine_queueing', 'max_num_seqs'),
        ),
      ],
      stages={ 'ml/qwen': 'engine_queueing:max_num_seqs', 'ml/chat': 'serving' },
    ),
    t.scenario(
      'an SGLang engine short of KV cache, beside a serving vLLM engine',
      $.sglangBesideVllm(12, 3, 0.96),
      fires=[
        t.alert(
          'GpuLedgerEngineQueueingKvCachePressure',
          f.engineKey('qwen-a', workload='qwen', model='qwen'),
          'Requests have been waiting in %s for %s with its KV cache 96%% full, and no sibling engine has headroom.' % [engineText('qwen-a', workload='qwen', model='qwen'), c.engineKvCachePressureFor]
          + t.nextStep('engine_queueing', 'kv_cache'),
        ),
      ],
      stages={ 'ml/qwen': 'engine_queueing:kv_cache', 'ml/chat': 'serving' },
    ),

    t.scenario(
      'healthy: serving, nothing waits',
      f.engine('chat-a', waiting=0, running=3, kv=0.3, gpus=['GPU-a'], preemptionsPerMinute=6)
      + f.engine('chat-b', waiting=0, running=5, kv=0.35, gpus=['GPU-b']),
      stages={ 'ml/chat': 'serving' },
      exprs=[
        t.expr('namespace_workload:gpuledger_engine_requests_running:sum', { 'namespace_workload:gpuledger_engine_requests_running:sum{namespace="ml",workload="chat"}': 8 }),
        t.expr('namespace_workload:gpuledger_engine_requests_waiting:sum', { 'namespace_workload:gpuledger_engine_requests_waiting:sum{namespace="ml",workload="chat"}': 0 }),
        t.expr('namespace_workload:gpuledger_engine_kv_cache_usage_ratio:max', { 'namespace_workload:gpuledger_engine_kv_cache_usage_ratio:max{namespace="ml",workload="chat"}': 0.35 }),
        // 6 preemptions a minute.
        t.expr('namespace_workload:gpuledger_engine_preemptions:rate5m', { 'namespace_workload:gpuledger_engine_preemptions:rate5m{namespace="ml",workload="chat"}': 0.1 }),
        t.expr('namespace_workload:gpuledger_engine_up:sum', { 'namespace_workload:gpuledger_engine_up:sum{namespace="ml",workload="chat"}': 2 }),
        t.expr('namespace_workload:gpuledger_engine_up:count', { 'namespace_workload:gpuledger_engine_up:count{namespace="ml",workload="chat"}': 2 }),
        t.expr('namespace_workload:gpuledger_engine_headroom:sum', { 'namespace_workload:gpuledger_engine_headroom:sum{namespace="ml",workload="chat"}': 2 }),
        t.expr('namespace_workload:gpuledger_engine_queueing:sum', { 'namespace_workload:gpuledger_engine_queueing:sum{namespace="ml",workload="chat"}': 0 }),
        t.expr('namespace_workload:gpuledger_routing_imbalance:sum', { 'namespace_workload:gpuledger_routing_imbalance:sum{namespace="ml",workload="chat"}': 0 }),
        t.expr('namespace_workload:gpuledger_stage_code:max', { 'namespace_workload:gpuledger_stage_code:max{namespace="ml",workload="chat"}': t.stages.serving.code }),
      ],
    ),

    t.scenario(
      'idle: engines up, no requests',
      f.engine('chat-a', gpus=['GPU-a']),
      stages={ 'ml/chat': 'idle' },
    ),

    t.scenario(
      'KV-cache pressure',
      $.kvPressureEngines,
      fires=$.kvPressureAlerts,
      stages={ 'ml/chat': 'engine_queueing:kv_cache' },
      exprs=[
        t.expr('namespace_workload_reason:gpuledger_engine_requests_waiting_by_reason:sum', {
          'namespace_workload_reason:gpuledger_engine_requests_waiting_by_reason:sum{namespace="ml",reason="capacity",workload="chat"}': 6,
          'namespace_workload_reason:gpuledger_engine_requests_waiting_by_reason:sum{namespace="ml",reason="deferred",workload="chat"}': 0,
        }),
        t.expr('namespace_workload:gpuledger_engine_headroom:sum', { 'namespace_workload:gpuledger_engine_headroom:sum{namespace="ml",workload="chat"}': 0 }),
      ],
    ),

    t.scenario(
      'bound by max_num_seqs with KV headroom',
      $.maxNumSeqsEngines,
      fires=$.maxNumSeqsAlerts,
      stages={ 'ml/chat': 'engine_queueing:max_num_seqs' },
      exprs=[
        t.expr('node_namespace_workload_pod_target_engine:gpuledger_engine_at_max_num_seqs:max', {
          ['node_namespace_workload_pod_target_engine:gpuledger_engine_at_max_num_seqs:max{engine="0",model_name="llama-3-8b",namespace="ml",node="gpu-node-1",pod="%s",pod_uid="uid-%s",target="%s:8000",workload="chat"}' % [p, p, p]]: 1
          for p in ['chat-a', 'chat-b']
        }),
      ],
    ),

    // Between the headroom and the pressure ratios, and below max_num_seqs: the engine
    // queues, but neither engine alert claims a cause it cannot prove.
    t.scenario(
      'queueing between the KV thresholds: no engine alert',
      f.engine('chat-a', waiting=2, running=5, kv=0.85, maxNumSeqs=8, gpus=['GPU-a']),
      stages={ 'ml/chat': 'engine_queueing:other' },
    ),

    // At max_num_seqs with KV headroom, but the engine defers every waiting request: the
    // reason is `deferred` (stronger in stages.json), so the max_num_seqs alert stays silent.
    t.scenario(
      'every waiting request deferred: no max_num_seqs alert',
      f.engine('chat-a', waiting=4, running=8, kv=0.4, maxNumSeqs=8, deferred=4, gpus=['GPU-a']),
      stages={ 'ml/chat': 'engine_queueing:deferred' },
      exprs=[
        t.expr('node_namespace_workload_pod_target_engine:gpuledger_engine_queue_reason_rank:max', {
          'node_namespace_workload_pod_target_engine:gpuledger_engine_queue_reason_rank:max{engine="0",model_name="llama-3-8b",namespace="ml",node="gpu-node-1",pod="chat-a",pod_uid="uid-chat-a",target="chat-a:8000",workload="chat"}': 3,
        }),
      ],
    ),

    t.scenario(
      'sticky routing',
      $.stickyRoutingEngines,
      fires=$.stickyRoutingAlerts,
      stages={ 'ml/chat': 'routing:imbalance' },
      exprs=[
        t.expr('namespace_workload:gpuledger_engine_queueing:sum', { 'namespace_workload:gpuledger_engine_queueing:sum{namespace="ml",workload="chat"}': 1 }),
        t.expr('namespace_workload:gpuledger_engine_headroom:sum', { 'namespace_workload:gpuledger_engine_headroom:sum{namespace="ml",workload="chat"}': 1 }),
        t.expr('namespace_workload:gpuledger_routing_imbalance:sum', { 'namespace_workload:gpuledger_routing_imbalance:sum{namespace="ml",workload="chat"}': 1 }),
        t.expr('node_namespace_workload_pod_target_engine:gpuledger_engine_at_max_num_seqs:max{pod="chat-a"}', {
          'node_namespace_workload_pod_target_engine:gpuledger_engine_at_max_num_seqs:max{engine="0",model_name="llama-3-8b",namespace="ml",node="gpu-node-1",pod="chat-a",pod_uid="uid-chat-a",target="chat-a:8000",workload="chat"}': 1,
        }),
      ],
    ),

    // A sibling that is idle but itself at max_num_seqs has no headroom: not a routing problem.
    t.scenario(
      'every engine full: no routing imbalance',
      f.engine('chat-a', waiting=3, running=8, kv=0.5, maxNumSeqs=8, gpus=['GPU-a'])
      + f.engine('chat-b', waiting=0, running=8, kv=0.5, maxNumSeqs=8, gpus=['GPU-b']),
      fires=[maxNumSeqsAlert('chat-a', 3)],
      stages={ 'ml/chat': 'engine_queueing:max_num_seqs' },
      exprs=[
        t.expr('namespace_workload:gpuledger_routing_imbalance:sum', { 'namespace_workload:gpuledger_routing_imbalance:sum{namespace="ml",workload="chat"}': 0 }),
      ],
    ),

    // Both engines of chat-a at their own max_num_seqs (8 and 16) with KV headroom: two
    // alerts, each with its engine's max_num_seqs. Keyed without `target` they would be one
    // engine, and gpuledger_engine_config_info's two max_num_seqs could not join one-to-one.
    t.scenario(
      'two engines of one pod on two targets (same model, same rank): two engines',
      f.engine('chat-a', target=targetA, waiting=5, running=8, kv=0.4, maxNumSeqs=8, gpus=['GPU-a'])
      + f.engine('chat-a', target=targetB, waiting=3, running=16, kv=0.45, maxNumSeqs=16, gpus=['GPU-b']),
      fires=[
        t.alert(
          'GpuLedgerEngineQueueingAtMaxNumSeqs',
          twoTargetKey(x.target) { max_num_seqs: std.toString(x.seqs) },
          '%d request(s) have been waiting in %s for %s while it runs max_num_seqs=%d requests and its KV cache is below %g%%: the max_num_seqs setting, not memory, bounds the batch, and no sibling engine has headroom.'
          % [x.waiting, engineText('chat-a', target=x.target), c.engineMaxNumSeqsFor, x.seqs, c.kvCacheHeadroomRatio * 100]
          + t.nextStep('engine_queueing', 'max_num_seqs'),
        )
        for x in [{ target: targetA, waiting: 5, seqs: 8 }, { target: targetB, waiting: 3, seqs: 16 }]
      ],
      stages={ 'ml/chat': 'engine_queueing:max_num_seqs' },
      exprs=[
        t.expr('node_namespace_workload_pod_target_engine:gpuledger_engine_at_max_num_seqs:max', {
          [twoTargetSeries('node_namespace_workload_pod_target_engine:gpuledger_engine_at_max_num_seqs:max', target)]: 1
          for target in [targetA, targetB]
        }),
        t.expr('namespace_workload:gpuledger_engine_queueing:sum', { 'namespace_workload:gpuledger_engine_queueing:sum{namespace="ml",workload="chat"}': 2 }),
      ],
    ),

    // One of chat-a's two engines queues, the other idles: a routing problem between two
    // engines of one pod. Merged into one engine they would queue at max_num_seqs instead.
    t.scenario(
      'two engines of one pod on two targets, one queueing, one idle: routing',
      f.engine('chat-a', target=targetA, waiting=12, running=8, kv=0.5, maxNumSeqs=8, gpus=['GPU-a'])
      + f.engine('chat-a', target=targetB, waiting=0, running=1, kv=0.05, maxNumSeqs=8, gpus=['GPU-b']),
      fires=[
        t.alert(
          'GpuLedgerRoutingImbalance',
          { namespace: 'ml', workload: 'chat' },
          '1 engine(s) of workload ml/chat have had requests waiting for %s while 1 sibling engine(s) have headroom: requests are not spread over the replicas.' % c.routingImbalanceFor
          + t.nextStep('routing', 'imbalance'),
        ),
      ],
      stages={ 'ml/chat': 'routing:imbalance' },
      exprs=[
        t.expr('node_namespace_workload_pod_target_engine:gpuledger_engine_queueing:max', {
          [twoTargetSeries('node_namespace_workload_pod_target_engine:gpuledger_engine_queueing:max', targetA)]: 1,
          [twoTargetSeries('node_namespace_workload_pod_target_engine:gpuledger_engine_queueing:max', targetB)]: 0,
        }),
        t.expr('node_namespace_workload_pod_target_engine:gpuledger_engine_headroom:max', {
          [twoTargetSeries('node_namespace_workload_pod_target_engine:gpuledger_engine_headroom:max', targetA)]: 0,
          [twoTargetSeries('node_namespace_workload_pod_target_engine:gpuledger_engine_headroom:max', targetB)]: 1,
        }),
      ],
    ),

    t.scenario(
      'engine parallelism mismatch',
      // tensor parallel 4, but its processes hold 2 GPUs.
      f.engine('big-a', workload='big', model='llama-3-70b', running=2, kv=0.2, tp=4, gpus=['GPU-1', 'GPU-2'])
      // Consistent: 2 x 2 = 4 GPUs, and 3 x 1 = 3.
      + f.engine('pp-a', workload='pp', running=1, tp=2, pp=2, gpus=['GPU-3', 'GPU-4', 'GPU-5', 'GPU-6'])
      + f.engine('odd-a', workload='odd', running=1, tp=3, gpus=['GPU-7', 'GPU-8', 'GPU-9'])
      // Processes not found (remote engine): nothing in use to compare.
      + f.engine('remote-a', workload='remote', running=1, tp=2, gpus=[]),
      fires=[
        t.alert(
          'GpuLedgerEngineParallelismMismatch',
          f.engineKey('big-a', workload='big', model='llama-3-70b') { tensor_parallel_size: '4', pipeline_parallel_size: '1' },
          'The processes of %s have held 2 GPU(s) for %s, but tensor_parallel_size=4 x pipeline_parallel_size=1 needs one GPU per rank.' % [engineText('big-a', 'big', 'llama-3-70b'), c.engineParallelismMismatchFor],
        ),
      ],
      stages={ 'ml/big': 'serving', 'ml/pp': 'serving', 'ml/odd': 'serving', 'ml/remote': 'serving' },
    ),
  ],
}
