{{/*
Target relabelings shared by the ServiceMonitor and the PodMonitor. The operator attaches
the exporter pod's own namespace/pod/container (and service/endpoint) to every target; the
exporter's series carry namespace/pod/container of the *GPU workloads*, so those target
labels are dropped: otherwise Prometheus renames the exporter's labels to exported_* (or,
with honorLabels, stamps the exporter's namespace onto series that have none, such as the
cluster view's Ray series). The exporter's own identity stays in `instance` and `node`.
*/}}
{{- define "gpuledger.monitorRelabelings" -}}
- action: labeldrop
  regex: (namespace|pod|container|service|endpoint)
{{- with .relabelings }}
{{ toYaml . }}
{{- end }}
{{- end -}}
