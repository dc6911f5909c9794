// The gpuledger monitoring mixin: recording rules, alerts and Grafana dashboards.
//
//   prometheusRules     recording rules (rules/rules.libsonnet), and for one release the
//                       old names of them (rules/aliases.libsonnet)
//   prometheusAlerts    alerts (alerts/alerts.libsonnet), each with a runbook_url
//   grafanaDashboards   dashboards by file name (dashboards/dashboards.libsonnet)
//
// Settings: config.libsonnet. Rendered output: scripts/render-mixin. See docs/mixin.md.
(import 'config.libsonnet') +
(import 'rules/rules.libsonnet') +
(import 'rules/aliases.libsonnet') +
(import 'alerts/alerts.libsonnet') +
(import 'alerts/add-runbook-links.libsonnet') +
(import 'dashboards/dashboards.libsonnet')
