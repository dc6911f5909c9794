{{/* Chart name, truncated to the 63 characters a label value allows. */}}
{{- define "gpuledger.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/*
Fully qualified app name. Truncated to 55 characters so that "<fullname>-cluster" still
fits the 63 characters of a name or label value.
*/}}
{{- define "gpuledger.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 55 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 55 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 55 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "gpuledger.namespace" -}}
{{- default .Release.Namespace .Values.namespaceOverride -}}
{{- end -}}

{{- define "gpuledger.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Labels of every object. */}}
{{- define "gpuledger.labels" -}}
helm.sh/chart: {{ include "gpuledger.chart" . }}
app.kubernetes.io/name: {{ include "gpuledger.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: gpuledger
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* Selector labels of a component: include with (dict "ctx" $ "component" "node"). */}}
{{- define "gpuledger.selectorLabels" -}}
app.kubernetes.io/name: {{ include "gpuledger.name" .ctx }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{/* Labels of a component's objects. */}}
{{- define "gpuledger.componentLabels" -}}
{{ include "gpuledger.labels" .ctx }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{/* The scrape job name of a component (ServiceMonitor/PodMonitor jobLabel). */}}
{{- define "gpuledger.jobName" -}}
{{- printf "%s-%s" .ctx.Values.jobName .component -}}
{{- end -}}

{{- define "gpuledger.serviceAccountName" -}}
{{- $values := index .ctx.Values .component -}}
{{- if $values.serviceAccount.create -}}
{{- default (printf "%s-%s" (include "gpuledger.fullname" .ctx) .component) $values.serviceAccount.name -}}
{{- else -}}
{{- default "default" $values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "gpuledger.image" -}}
{{- $registry := default .Values.image.registry .Values.global.imageRegistry -}}
{{- $repository := .Values.image.repository -}}
{{- if $registry -}}
{{- $repository = printf "%s/%s" $registry $repository -}}
{{- end -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" $repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" $repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}
{{- end -}}

{{- define "gpuledger.imagePullSecrets" -}}
{{- $secrets := concat .Values.global.imagePullSecrets .Values.imagePullSecrets -}}
{{- with $secrets }}
imagePullSecrets:
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* Where the Ray token Secret is mounted. */}}
{{- define "gpuledger.rayTokenDir" -}}
/etc/gpuledger/ray
{{- end -}}

{{/*
Environment shared by both modes: the exporter's GPULEDGER_* settings.
Include with (dict "ctx" $ "component" "node").
*/}}
{{- define "gpuledger.commonEnv" -}}
{{- $v := .ctx.Values -}}
- name: GPULEDGER_MODE
  value: {{ .component | quote }}
- name: GPULEDGER_LISTEN
  value: {{ printf ":%d" (int $v.exporter.port) | quote }}
- name: GPULEDGER_INTERVAL
  value: {{ $v.exporter.interval | toString | quote }}
- name: GPULEDGER_SOURCE_DEADLINE
  value: {{ $v.exporter.sourceDeadline | toString | quote }}
- name: GPULEDGER_LOG_LEVEL
  value: {{ $v.exporter.logLevel | quote }}
- name: GPULEDGER_LOG_FORMAT
  value: {{ $v.exporter.logFormat | quote }}
- name: GPULEDGER_KUBERNETES
  value: "on"
- name: GPULEDGER_GPU_RESOURCES
  value: {{ join "," $v.exporter.gpuResources | quote }}
- name: NODE_NAME
  valueFrom:
    fieldRef:
      fieldPath: spec.nodeName
{{- if $v.ray.address }}
- name: GPULEDGER_RAY_ADDRESS
  value: {{ $v.ray.address | quote }}
{{- end }}
{{- if $v.ray.tokenSecret.name }}
- name: GPULEDGER_RAY_TOKEN_FILE
  value: {{ printf "%s/%s" (include "gpuledger.rayTokenDir" .ctx) $v.ray.tokenSecret.key | quote }}
{{- end }}
{{- end -}}

{{/* The Ray token volume and mount, when a Secret is named. */}}
{{- define "gpuledger.rayTokenVolume" -}}
{{- with .Values.ray.tokenSecret.name }}
- name: ray-token
  secret:
    secretName: {{ . }}
    defaultMode: 0440
    items:
      - key: {{ $.Values.ray.tokenSecret.key }}
        path: {{ $.Values.ray.tokenSecret.key }}
{{- end }}
{{- end -}}

{{- define "gpuledger.rayTokenMount" -}}
{{- if .Values.ray.tokenSecret.name }}
- name: ray-token
  mountPath: {{ include "gpuledger.rayTokenDir" . }}
  readOnly: true
{{- end }}
{{- end -}}

{{/*
exporter.webConfig: the web config Secret (and an optional TLS Secret, e.g. cert-manager's)
projected read-only into one folder, so that relative paths in web-config.yml name the
certificate files next to it. A whole-folder mount, never subPath: the kubelet then
replaces the files in place when a Secret changes, and the exporter re-reads the
certificate and key when their files change.
*/}}
{{- define "gpuledger.webConfigDir" -}}
/etc/gpuledger/web
{{- end -}}

{{- define "gpuledger.webConfigCheck" -}}
{{- $w := .Values.exporter.webConfig -}}
{{- if and (or $w.tls $w.tlsSecretName) (not $w.secretName) -}}
{{- fail "exporter.webConfig.tls and exporter.webConfig.tlsSecretName need exporter.webConfig.secretName: the Secret holding web-config.yml (docs/install.md, \"Restricting access\")" -}}
{{- end -}}
{{- end -}}

{{- define "gpuledger.webConfigEnv" -}}
{{- include "gpuledger.webConfigCheck" . -}}
{{- if .Values.exporter.webConfig.secretName }}
- name: GPULEDGER_WEB_CONFIG_FILE
  value: {{ printf "%s/web-config.yml" (include "gpuledger.webConfigDir" .) | quote }}
{{- end }}
{{- end -}}

{{- define "gpuledger.webConfigVolume" -}}
{{- $w := .Values.exporter.webConfig -}}
{{- if $w.secretName }}
- name: web-config
  projected:
    defaultMode: 0440
    sources:
      - secret:
          name: {{ $w.secretName }}
      {{- with $w.tlsSecretName }}
      - secret:
          name: {{ . }}
      {{- end }}
{{- end }}
{{- end -}}

{{- define "gpuledger.webConfigMount" -}}
{{- if .Values.exporter.webConfig.secretName }}
- name: web-config
  mountPath: {{ include "gpuledger.webConfigDir" . }}
  readOnly: true
{{- end }}
{{- end -}}

{{/*
cluster.prometheus: the fleet page's Prometheus (GPULEDGER_PROMETHEUS_* = serve's
--prometheus-* flags); its token and CA mounted as files, never environment values.
*/}}
{{- define "gpuledger.prometheusEnv" -}}
{{- $p := .Values.cluster.prometheus -}}
{{- if $p.url }}
- name: GPULEDGER_PROMETHEUS_URL
  value: {{ $p.url | quote }}
{{- if $p.bearerTokenSecretName }}
- name: GPULEDGER_PROMETHEUS_BEARER_TOKEN_FILE
  value: {{ printf "/etc/gpuledger/prometheus-token/%s" $p.bearerTokenKey | quote }}
{{- end }}
{{- if $p.caSecretName }}
- name: GPULEDGER_PROMETHEUS_CA_FILE
  value: {{ printf "/etc/gpuledger/prometheus-ca/%s" $p.caKey | quote }}
{{- end }}
{{- with $p.serverName }}
- name: GPULEDGER_PROMETHEUS_SERVER_NAME
  value: {{ . | quote }}
{{- end }}
{{- with $p.selector }}
- name: GPULEDGER_PROMETHEUS_SELECTOR
  value: {{ . | quote }}
{{- end }}
{{- end }}
{{- end -}}

{{- define "gpuledger.prometheusVolume" -}}
{{- $p := .Values.cluster.prometheus -}}
{{- if and $p.url $p.bearerTokenSecretName }}
- name: prometheus-token
  secret:
    secretName: {{ $p.bearerTokenSecretName }}
    defaultMode: 0440
    items:
      - key: {{ $p.bearerTokenKey }}
        path: {{ $p.bearerTokenKey }}
{{- end }}
{{- if and $p.url $p.caSecretName }}
- name: prometheus-ca
  secret:
    secretName: {{ $p.caSecretName }}
    defaultMode: 0440
    items:
      - key: {{ $p.caKey }}
        path: {{ $p.caKey }}
{{- end }}
{{- end -}}

{{- define "gpuledger.prometheusMount" -}}
{{- $p := .Values.cluster.prometheus -}}
{{- if and $p.url $p.bearerTokenSecretName }}
- name: prometheus-token
  mountPath: /etc/gpuledger/prometheus-token
  readOnly: true
{{- end }}
{{- if and $p.url $p.caSecretName }}
- name: prometheus-ca
  mountPath: /etc/gpuledger/prometheus-ca
  readOnly: true
{{- end }}
{{- end -}}

{{/*
cluster.agentAccess: how the cluster view's cluster-wide /ledger reads the node agents'
/ledger.json when exporter.webConfig protects them (GPULEDGER_AGENT_* = serve's --agent-*
flags). With exporter.webConfig.tls: https, verified against cluster.agentAccess.caSecretName's
CA, else the ca.crt of exporter.webConfig.tlsSecretName (cert-manager writes it), which the
web-config volume already holds. Basic auth: the USER:PASSWORD of authSecretName's key
`auth`, mounted as a file, never an environment variable.
*/}}
{{- define "gpuledger.agentCaDir" -}}
/etc/gpuledger/agent-ca
{{- end -}}

{{- define "gpuledger.agentAuthDir" -}}
/etc/gpuledger/agent-auth
{{- end -}}

{{- define "gpuledger.agentAccessEnv" -}}
{{- include "gpuledger.webConfigCheck" . -}}
{{- $a := .Values.cluster.agentAccess -}}
{{- $w := .Values.exporter.webConfig -}}
{{- if $w.tls }}
{{- if not (or $a.caSecretName $w.tlsSecretName) -}}
{{- fail "exporter.webConfig.tls: the cluster view verifies the node agents' certificate against a CA: set exporter.webConfig.tlsSecretName (a cert-manager Certificate's Secret, with ca.crt) or cluster.agentAccess.caSecretName (docs/install.md, \"Restricting access\")" -}}
{{- end }}
- name: GPULEDGER_AGENT_TLS
  value: "true"
- name: GPULEDGER_AGENT_CA_FILE
  {{- if $a.caSecretName }}
  value: {{ printf "%s/%s" (include "gpuledger.agentCaDir" .) $a.caKey | quote }}
  {{- else }}
  value: {{ printf "%s/ca.crt" (include "gpuledger.webConfigDir" .) | quote }}
  {{- end }}
{{- with $a.serverName }}
- name: GPULEDGER_AGENT_SERVER_NAME
  value: {{ . | quote }}
{{- end }}
{{- end }}
{{- if $a.authSecretName }}
- name: GPULEDGER_AGENT_AUTH_FILE
  value: {{ printf "%s/auth" (include "gpuledger.agentAuthDir" .) | quote }}
{{- end }}
{{- end -}}

{{- define "gpuledger.agentAccessVolume" -}}
{{- $a := .Values.cluster.agentAccess -}}
{{- if and .Values.exporter.webConfig.tls $a.caSecretName }}
- name: agent-ca
  secret:
    secretName: {{ $a.caSecretName }}
    defaultMode: 0440
    items:
      - key: {{ $a.caKey }}
        path: {{ $a.caKey }}
{{- end }}
{{- with $a.authSecretName }}
- name: agent-auth
  secret:
    secretName: {{ . }}
    defaultMode: 0440
    items:
      - key: auth
        path: auth
{{- end }}
{{- end -}}

{{- define "gpuledger.agentAccessMount" -}}
{{- $a := .Values.cluster.agentAccess -}}
{{- if and .Values.exporter.webConfig.tls $a.caSecretName }}
- name: agent-ca
  mountPath: {{ include "gpuledger.agentCaDir" . }}
  readOnly: true
{{- end }}
{{- if $a.authSecretName }}
- name: agent-auth
  mountPath: {{ include "gpuledger.agentAuthDir" . }}
  readOnly: true
{{- end }}
{{- end -}}

{{/*
A probe from values, with httpGet.scheme HTTPS when the exporter serves TLS (a plain HTTP
probe of a TLS port always fails; the kubelet does not verify the certificate). Include
with (dict "ctx" $ "probe" $v.livenessProbe); empty when the probe is.
*/}}
{{- define "gpuledger.probe" -}}
{{- $probe := deepCopy (.probe | default dict) -}}
{{- if and .ctx.Values.exporter.webConfig.tls $probe.httpGet -}}
{{- $_ := set $probe.httpGet "scheme" "HTTPS" -}}
{{- end -}}
{{- with $probe }}
{{- toYaml . }}
{{- end }}
{{- end -}}

{{/*
TLS and basic auth of a ServiceMonitor endpoint / PodMonitor podMetricsEndpoint:
include with (dict "ctx" $ "monitor" $v).
*/}}
{{- define "gpuledger.monitorScheme" -}}
scheme: {{ ternary "https" "http" (.ctx.Values.exporter.webConfig.tls | default false) }}
{{- with .monitor.tlsConfig }}
tlsConfig:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .monitor.basicAuth }}
basicAuth:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/*
cluster.gateway: InferencePools and their endpoint pickers (GPULEDGER_GATEWAY_* = serve's
--gateway flags). The picker token is a service account's that may only GET /metrics
(<fullname>-picker-reader, rbac.yaml), or an existing Secret's: never the cluster view's own
token, which whoever creates an InferencePool could otherwise harvest at a picker of theirs.
*/}}
{{- define "gpuledger.pickerTokenSecret" -}}
{{- $g := .Values.cluster.gateway -}}
{{- if $g.pickerToken.existingSecret -}}
{{ $g.pickerToken.existingSecret }}
{{- else if $g.pickerToken.create -}}
{{ include "gpuledger.fullname" . }}-picker-reader
{{- end -}}
{{- end -}}

{{- define "gpuledger.gatewayEnv" -}}
{{- $g := .Values.cluster.gateway -}}
- name: GPULEDGER_GATEWAY
  value: {{ if $g.enabled }}"auto"{{ else }}"off"{{ end }}
{{- if $g.enabled }}
{{- with $g.pickerURLs }}
- name: GPULEDGER_GATEWAY_PICKER_URLS
  value: {{ join "," (include "gpuledger.pickerURLPairs" $g | fromYamlArray) | quote }}
{{- end }}
{{- if include "gpuledger.pickerTokenSecret" . }}
- name: GPULEDGER_GATEWAY_PICKER_TOKEN_FILE
  value: {{ printf "/etc/gpuledger/picker-token/%s" $g.pickerToken.key | quote }}
{{- end }}
{{- if $g.caSecretName }}
- name: GPULEDGER_GATEWAY_PICKER_CA_FILE
  value: {{ printf "/etc/gpuledger/picker-ca/%s" $g.caKey | quote }}
{{- end }}
{{- end }}
{{- end -}}

{{- define "gpuledger.pickerURLPairs" -}}
{{- range $pool, $url := .pickerURLs }}
- {{ printf "%s=%s" $pool $url | quote }}
{{- end }}
{{- end -}}

{{- define "gpuledger.gatewayVolume" -}}
{{- $g := .Values.cluster.gateway -}}
{{- if $g.enabled }}
{{- with include "gpuledger.pickerTokenSecret" . }}
- name: picker-token
  secret:
    secretName: {{ . }}
    defaultMode: 0440
    items:
      - key: {{ $g.pickerToken.key }}
        path: {{ $g.pickerToken.key }}
{{- end }}
{{- if $g.caSecretName }}
- name: picker-ca
  secret:
    secretName: {{ $g.caSecretName }}
    defaultMode: 0440
    items:
      - key: {{ $g.caKey }}
        path: {{ $g.caKey }}
{{- end }}
{{- end }}
{{- end -}}

{{- define "gpuledger.gatewayMount" -}}
{{- $g := .Values.cluster.gateway -}}
{{- if $g.enabled }}
{{- if include "gpuledger.pickerTokenSecret" . }}
- name: picker-token
  mountPath: /etc/gpuledger/picker-token
  readOnly: true
{{- end }}
{{- if $g.caSecretName }}
- name: picker-ca
  mountPath: /etc/gpuledger/picker-ca
  readOnly: true
{{- end }}
{{- end }}
{{- end -}}
