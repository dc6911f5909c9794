// Adds `runbook_url` to every alert, in one place: config runbookURLPattern formatted
// with the lower-case alert name, which is the anchor of the alert's heading in
// docs/runbooks.md (on GitHub-style forges, and on the /runbooks page every agent serves).
{
  local c = $._config,
  prometheusAlerts+:: {
    groups: [
      group {
        rules: [
          if std.objectHas(rule, 'alert') then
            rule { annotations+: { runbook_url: c.runbookURLPattern % std.asciiLower(rule.alert) } }
          else rule
          for rule in group.rules
        ],
      }
      for group in super.groups
    ],
  },
}
