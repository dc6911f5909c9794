// Helpers that turn scenarios into promtool rule-test files (scripts/render-mixin renders
// every tests/*.jsonnet into the .yaml next to it).
//
// A scenario names the one alert it must fire (or none). For it, the rendered test checks
// every alert of the mixin, not only the expected one:
//   * one minute before the expected alert's `for` ends: nothing fires;
//   * when its `for` ends: exactly the expected alerts fire, every other alert is silent;
//   * at the horizon, after the longest `for` of any alert: still exactly those.
// so "fires exactly its alert" covers both sides of the `for:` boundary and every alert
// that could have fired by mistake. Thresholds and `for` values come from the config,
// so the tests follow a change of config.libsonnet.
local mixin = import '../mixin.libsonnet';

local config = mixin._config;
local stageDefs = { [s.stage]: s for s in mixin._stages.stages };
local groupNames = [g.name for g in mixin.prometheusRules.groups + mixin.prometheusAlerts.groups];
local alertRules = {
  [r.alert]: r
  for g in mixin.prometheusAlerts.groups
  for r in g.rules
};

// '10m' -> 10, '1h' -> 60. Tests run on a one-minute grid.
local minutes(d) =
  local unit = std.substr(d, std.length(d) - 1, 1);
  local n = std.parseInt(std.substr(d, 0, std.length(d) - 1));
  if unit == 'm' then n
  else if unit == 'h' then n * 60
  else error 'for: %s is not whole minutes or hours' % d;

local horizon = std.foldl(std.max, [minutes(r['for']) for r in std.objectValues(alertRules)], 0) + 10;
// Samples cover the horizon with room for the 5m rate windows.
local samples = horizon + 10;

// The scrape targets of the two agents, as config.libsonnet's gpuledgerNodeSelector and
// gpuledgerClusterSelector select them. An agent without any target fires
// GpuLedgerExporterDown, so a scenario that has no `up` series of one gets it healthy.
local nodeTarget = { job: 'gpuledger-node', instance: '10.0.0.11:9402' };
local clusterTarget = { job: 'gpuledger-cluster', instance: '10.0.0.5:9402' };
assert config.gpuledgerNodeSelector == 'job="%s"' % nodeTarget.job
       : 'tests/lib.libsonnet: nodeTarget must match gpuledgerNodeSelector';
assert config.gpuledgerClusterSelector == 'job="%s"' % clusterTarget.job
       : 'tests/lib.libsonnet: clusterTarget must match gpuledgerClusterSelector';

// String concatenation rather than `%`: std.format is slow in the C++ jsonnet, and
// scenarios build thousands of these.
local labelString(labels) =
  std.join(',', [k + '="' + labels[k] + '"' for k in std.objectFields(labels)]);
local duration(minute) = std.toString(minute) + 'm';

{
  config:: config,
  // Stage definitions (lib/stages.json) by name.
  stages:: stageDefs,
  alertNames:: std.objectFields(alertRules),
  horizon:: horizon,
  minutes:: minutes,
  nodeTarget:: nodeTarget,
  clusterTarget:: clusterTarget,

  // Input series ---------------------------------------------------------------------

  // A gauge constant over the whole test: 'v+0xN'.
  gauge(name, labels, value):: {
    series: name + '{' + labelString(labels) + '}',
    values: std.toString(value) + '+0x' + std.toString(samples),
  },
  // A counter growing by `perMinute` every minute from `start`.
  counter(name, labels, perMinute, start=0):: {
    series: name + '{' + labelString(labels) + '}',
    values: std.toString(start) + '+' + std.toString(perMinute) + 'x' + std.toString(samples),
  },

  // Expected alerts ------------------------------------------------------------------

  // How a stage alert's description ends: the next step of the verdict (stage, reason) as
  // lib/stages.json words it for `gpuledger explain` and the /ledger page.
  nextStep(stage, reason):: ' Next step: ' + std.get(std.get(stageDefs[stage], 'by_reason', {}), reason, stageDefs[stage]).next_step,

  // One firing alert: its labels (the rule's own labels are added) and its description
  // as the template must render it. summary and runbook_url come from the rule.
  alert(name, labels, description):: {
    alertname: name,
    alert: {
      exp_labels: labels + alertRules[name].labels,
      exp_annotations: {
        summary: alertRules[name].annotations.summary,
        description: description,
        runbook_url: alertRules[name].annotations.runbook_url,
      },
    },
  },

  // A scenario: a test group.
  //   fires:  [alert(...)] all of one alert name, or [] when nothing may fire
  //   stages: {'namespace/workload': 'stage' or 'stage:reason'} expected at the horizon
  //           (every workload the rules know must be listed; a stage that has reasons in
  //           lib/stages.json must name the reason)
  //   exprs:  extra promql_expr_test cases
  //   after:  the minute the expected alert's condition starts to hold (series that change
  //           then), so `for` ends `after` minutes later
  //   targets: false: no healthy `up` series is added for an agent the series lack
  scenario(name, series, fires=[], stages={}, exprs=[], after=0, targets=true)::
    local names = std.set([f.alertname for f in fires]);
    assert std.length(names) <= 1 : 'scenario %s: one alert name per scenario' % name;
    local expected = if std.length(names) == 1 then names[0] else null;
    local at = if expected == null then horizon else after + minutes(alertRules[expected]['for']);
    assert expected == null || at < horizon : 'scenario %s: the alert must fire before the horizon' % name;
    local hasTarget(target) = [
      s
      for s in series
      if std.startsWith(s.series, 'up{') && std.length(std.findSubstr('job="%s"' % target.job, s.series)) > 0
    ] != [];
    local healthy = [$.gauge('up', t, 1) for t in [nodeTarget, clusterTarget] if targets && !hasTarget(t)];
    local check(minute, firing) = [
      {
        eval_time: duration(minute),
        alertname: a,
        exp_alerts: if firing && a == expected then [f.alert for f in fires] else [],
      }
      for a in std.objectFields(alertRules)
    ];
    local workloadLabels(key) =
      local parts = std.split(key, '/');
      (if std.length(parts) == 2 && parts[0] != '' then { namespace: parts[0] } else {})
      + { workload: parts[std.length(parts) - 1] };
    local stageOf(key) = std.split(stages[key], ':')[0];
    local reasonLabel(key) =
      local parts = std.split(stages[key], ':');
      local def = stageDefs[parts[0]];
      assert (std.length(parts) == 2) == (def.reasons != [])
             : 'scenario %s: %s: say the reason of stage %s, and only if it has reasons' % [name, key, parts[0]];
      assert std.length(parts) == 1 || std.member(def.reasons, parts[1])
             : 'scenario %s: %s: %s is no reason of stage %s' % [name, key, parts[1], parts[0]];
      if std.length(parts) == 2 then { reason: parts[1] } else {};
    local stageSample(key) = {
      labels: 'namespace_workload_stage:gpuledger_stage_code:onehot{' + labelString(workloadLabels(key) + { stage: stageOf(key) }) + '}',
      value: 1,
    };
    local reasonSample(key) = {
      labels: 'namespace_workload_stage_reason:gpuledger_stage_reason_code:group{' + labelString(workloadLabels(key) + { stage: stageOf(key) } + reasonLabel(key)) + '}',
      value: 1,
    };
    {
      name: name,
      interval: '1m',
      input_series: series + healthy,
      alert_rule_test:
        (if expected == null then [] else check(at - 1, false) + check(at, true))
        + check(horizon, true),
      promql_expr_test: [
        {
          expr: 'namespace_workload_stage:gpuledger_stage_code:onehot == 1',
          eval_time: duration(horizon),
          exp_samples: [stageSample(k) for k in std.objectFields(stages)],
        },
        {
          expr: 'namespace_workload_stage_reason:gpuledger_stage_reason_code:group',
          eval_time: duration(horizon),
          exp_samples: [reasonSample(k) for k in std.objectFields(stages)],
        },
        // Exactly one stage is 1 for every workload, and one series per stage exists.
        {
          expr: |||
            sum by (namespace, workload) (namespace_workload_stage:gpuledger_stage_code:onehot) != 1
            or
            count by (namespace, workload) (namespace_workload_stage:gpuledger_stage_code:onehot) != %d
          ||| % std.length(mixin._stages.stages),
          eval_time: duration(horizon),
          exp_samples: [],
        },
      ] + exprs,
    },

  // A promql_expr_test at the horizon. samples: {'<series selector>': value}.
  expr(expr, samples):: {
    expr: expr,
    eval_time: duration(horizon),
    exp_samples: [{ labels: k, value: samples[k] } for k in std.objectFields(samples)],
  },

  // The test file.
  file(tests):: {
    rule_files: ['../rendered/gpuledger.rules.yaml'],
    evaluation_interval: '1m',
    // Recording rules first: alerts see them at the same timestamp, as the tests assume.
    group_eval_order: groupNames,
    tests: tests,
  },
}
