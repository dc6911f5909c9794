// Plain jsonnet helpers that build Grafana dashboard JSON (schemaVersion 39); no
// external library. Panels are laid out by `layout`, which gives every panel its id and
// gridPos; every query goes to the `datasource` variable.
local ds = { type: 'prometheus', uid: '${datasource}' };

{
  // ---------------------------------------------------------------- selectors

  // `{...}` for a query: the gpuledger job selector (raw series only: recording rules
  // carry no job), the cluster matcher when multi-cluster, then `matchers`.
  // Empty when there is nothing to match.
  selector(c, matchers=[], raw=true)::
    local all = (if raw then [c.gpuledgerSelector] else [])
                + (if c.showMultiCluster then ['%s=~"$cluster"' % c.clusterLabel] else [])
                + matchers;
    if all == [] then '' else '{' + std.join(', ', all) + '}',

  // ---------------------------------------------------------------- variables

  datasourceVariable:: {
    type: 'datasource',
    name: 'datasource',
    label: 'Data source',
    query: 'prometheus',
    current: {},
    hide: 0,
    refresh: 1,
    regex: '',
    includeAll: false,
    multi: false,
  },

  // A label_values() variable. allValue `.*` also matches an empty or missing label
  // (namespace-less Ray series).
  queryVariable(name, label, query, multi=true, includeAll=true, hide=0):: {
    type: 'query',
    name: name,
    label: label,
    datasource: ds,
    query: { query: query, refId: 'StandardVariableQuery' },
    definition: query,
    refresh: 2,
    sort: 1,
    hide: hide,
    multi: multi,
    includeAll: includeAll,
    current: {},
    options: [],
    regex: '',
  } + (if includeAll then { allValue: '.*' } else {}),

  // The cluster variable: hidden unless the config shows several clusters.
  clusterVariable(c, metric):: $.queryVariable(
    'cluster',
    'Cluster',
    'label_values(%s{%s}, %s)' % [metric, c.gpuledgerSelector, c.clusterLabel],
    multi=false,
    includeAll=false,
    hide=if c.showMultiCluster then 0 else 2,
  ),

  // ---------------------------------------------------------------- targets

  // exemplar: show the series' exemplars (gpuledger's request histograms carry trace_id,
  // which a data link on the datasource turns into a link to the trace).
  target(expr, legend='', instant=false, table=false, exemplar=false):: {
    datasource: ds,
    expr: expr,
    legendFormat: legend,
    range: !instant,
    instant: instant,
    format: if table then 'table' else 'time_series',
  } + (if exemplar then { exemplar: true } else {}),

  // ---------------------------------------------------------------- panels

  local base(type, title, description, unit, targets) = {
    type: type,
    title: title,
    description: description,
    datasource: ds,
    targets: [
      targets[i] { refId: std.char(std.codepoint('A') + i) }
      for i in std.range(0, std.length(targets) - 1)
    ],
    fieldConfig: { defaults: { unit: unit }, overrides: [] },
    options: {},
  },

  timeseries(title, description, unit, targets, stack=false, min=0, max=null, thresholds=null)::
    base('timeseries', title, description, unit, targets) {
      fieldConfig+: {
        defaults+: {
                     min: min,
                     custom: {
                       drawStyle: 'line',
                       lineWidth: 1,
                       fillOpacity: if stack then 60 else 10,
                       showPoints: 'never',
                       spanNulls: false,
                       stacking: { mode: if stack then 'normal' else 'none', group: 'A' },
                       thresholdsStyle: { mode: if thresholds == null then 'off' else 'dashed' },
                     },
                   } + (if max == null then {} else { max: max })
                   + (if thresholds == null then {} else {
                        thresholds: {
                          mode: 'absolute',
                          steps: [{ color: 'green', value: null }] + [
                            { color: s[1], value: s[0] }
                            for s in thresholds
                          ],
                        },
                      }),
      },
      options: {
        legend: { displayMode: 'table', placement: 'bottom', showLegend: true, calcs: ['lastNotNull', 'max'] },
        tooltip: { mode: 'multi', sort: 'desc' },
      },
    },

  stat(title, description, unit, targets, colorSteps=[{ color: 'green', value: null }])::
    base('stat', title, description, unit, targets) {
      fieldConfig+: {
        defaults+: { thresholds: { mode: 'absolute', steps: colorSteps } },
      },
      options: {
        reduceOptions: { calcs: ['lastNotNull'], fields: '', values: false },
        colorMode: 'background',
        graphMode: 'area',
        justifyMode: 'auto',
        textMode: 'auto',
        orientation: 'auto',
      },
    },

  // A table of instant queries merged on their labels. columns: [[field, header], ...]
  // in display order; other fields are hidden. units: {field: unit} per column.
  table(title, description, unit, targets, columns, units={})::
    base('table', title, description, unit, [t { instant: true, range: false, format: 'table' } for t in targets]) {
      fieldConfig+: {
        overrides: [
          {
            matcher: { id: 'byName', options: field },
            properties: [{ id: 'unit', value: units[field] }],
          }
          for field in std.objectFields(units)
        ],
      },
      options: { showHeader: true, cellHeight: 'sm', footer: { show: false } },
      transformations: [
        { id: 'merge', options: {} },
        {
          id: 'organize',
          options: {
            excludeByName: { Time: true },
            includeByName: { [col[0]]: true for col in columns },
            indexByName: { [columns[i][0]]: i for i in std.range(0, std.length(columns) - 1) },
            renameByName: { [col[0]]: col[1] for col in columns },
          },
        },
      ],
    },

  // Discrete states over time. states: [[value, text, color], ...].
  stateTimeline(title, description, targets, states)::
    base('state-timeline', title, description, 'none', targets) {
      fieldConfig+: {
        defaults+: {
          color: { mode: 'thresholds' },
          mappings: [
            {
              type: 'value',
              options: { [std.toString(s[0])]: { text: s[1], color: s[2], index: i } for i in std.range(0, std.length(states) - 1) for s in [states[i]] },
            },
          ],
          thresholds: { mode: 'absolute', steps: [{ color: 'transparent', value: null }] },
        },
      },
      options: {
        mergeValues: true,
        showValue: 'never',
        rowHeight: 0.9,
        alignValue: 'left',
        legend: { displayMode: 'list', placement: 'bottom', showLegend: true },
        tooltip: { mode: 'single', sort: 'none' },
      },
    },

  // ---------------------------------------------------------------- layout

  // A panel `w` columns wide (of 24); panels without a width share what is left.
  width(panel, w):: panel { gridWidth:: w },

  // sections: [{ title: 'Row title' or null, height: n, panels: [...] }]. The panels of
  // one section share one line; the first starts at row y0.
  layout(sections, y0=0)::
    local widthOf(p, default) = if std.objectHasAll(p, 'gridWidth') then p.gridWidth else default;
    local place(acc, section) =
      local fixed = std.foldl(function(s, p) s + widthOf(p, 0), section.panels, 0);
      local flexible = std.length([p for p in section.panels if !std.objectHasAll(p, 'gridWidth')]);
      local share = if flexible == 0 then 0 else std.floor((24 - fixed) / flexible);
      local row = if std.get(section, 'title', null) == null then [] else [{
        type: 'row',
        title: section.title,
        collapsed: false,
        panels: [],
        id: acc.id,
        gridPos: { h: 1, w: 24, x: 0, y: acc.y },
      }];
      local y = acc.y + std.length(row);
      local id0 = acc.id + std.length(row);
      // The last panel without a width also takes what the rounding left.
      local lastFlexible = std.foldl(
        function(last, i) if std.objectHasAll(section.panels[i], 'gridWidth') then last else i,
        std.range(0, std.length(section.panels) - 1),
        -1,
      );
      local widths = [
        widthOf(section.panels[i], if i == lastFlexible then 24 - fixed - share * (flexible - 1) else share)
        for i in std.range(0, std.length(section.panels) - 1)
      ];
      local xs = std.foldl(function(l, w) l + [l[std.length(l) - 1] + w], widths, [0]);
      {
        id: id0 + std.length(section.panels),
        y: y + section.height,
        panels: acc.panels + row + [
          section.panels[i] {
            id: id0 + i,
            gridPos: { h: section.height, w: widths[i], x: xs[i], y: y },
          }
          for i in std.range(0, std.length(section.panels) - 1)
        ],
      };
    std.foldl(place, sections, { id: 1, y: y0, panels: [] }).panels,

  // ---------------------------------------------------------------- simulated data

  // The banner at the top of every dashboard: "SIMULATED DATA" in red while an exporter in
  // view runs `gpuledger demo` or `simulate` (gpuledger_build_info{simulated="true"}: made-up
  // GPUs, pods and engines), and nothing at all otherwise (no title, no background, a blank
  // for "no data"). Found by tests/mixin/test_dashboards.py by its query.
  simulatedQuery(c):: 'max(gpuledger_build_info%s)' % $.selector(c, ['simulated="true"']),
  simulatedText:: 'SIMULATED DATA: gpuledger demo/simulate, not real GPUs, pods or engines',
  simulatedBanner(c)::
    $.stat(
      '',
      'Shown while a gpuledger exporter in view runs `gpuledger demo` or `gpuledger simulate` (gpuledger_build_info{simulated="true"}): its GPUs, pods, engines and alerts are made up by the simulator. Blank for exporters of real hardware.',
      'none',
      [$.target($.simulatedQuery(c))],
      [{ color: 'transparent', value: null }],
    ) + {
      transparent: true,
      fieldConfig+: {
        defaults+: {
          noValue: ' ',
          mappings: [{ type: 'value', options: { '1': { text: $.simulatedText, color: 'red', index: 0 } } }],
        },
      },
      options+: { graphMode: 'none', textMode: 'value', justifyMode: 'center' },
    },

  // ---------------------------------------------------------------- dashboard

  // sections: as `layout` takes them, below the simulated-data banner.
  dashboard(c, title, uid, description, variables, sections):: {
    title: title,
    uid: uid,
    description: description,
    tags: c.dashboardTags,
    timezone: c.dashboardTimezone,
    refresh: c.dashboardRefresh,
    time: { from: c.dashboardTimeFrom, to: 'now' },
    schemaVersion: 39,
    version: 1,
    editable: true,
    // Shared crosshair: the layers line up on one time axis.
    graphTooltip: 1,
    annotations: { list: [] },
    links: [{
      type: 'dashboards',
      title: 'gpuledger',
      tags: c.dashboardTags,
      asDropdown: true,
      includeVars: true,
      keepTime: true,
    }],
    templating: { list: variables },
    // The banner on top, with the id after the others': the panels' ids (viewPanel links)
    // do not move for it.
    local body = $.layout(sections, y0=bannerHeight),
    local bannerHeight = 2,
    panels: [
      $.simulatedBanner(c) {
        id: std.foldl(std.max, [p.id for p in body], 0) + 1,
        gridPos: { h: bannerHeight, w: 24, x: 0, y: 0 },
      },
    ] + body,
  },
}
