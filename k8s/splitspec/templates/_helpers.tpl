{{/* Names and labels. */}}
{{- define "splitspec.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "splitspec.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else if contains (include "splitspec.name" .) .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name (include "splitspec.name" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{/* (dict "root" $ "component" "draft") */}}
{{- define "splitspec.componentName" -}}
{{- printf "%s-%s" (include "splitspec.fullname" .root) .component | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "splitspec.selectorLabels" -}}
app.kubernetes.io/name: {{ include "splitspec.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "splitspec.labels" -}}
{{ include "splitspec.selectorLabels" . }}
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .root.Chart.Name .root.Chart.Version }}
{{- end -}}

{{/* The drafts' headless Service as the router resolves it: HOST:PORT. */}}
{{- define "splitspec.draftDnsName" -}}
{{- printf "%s.%s.svc.%s:%d" (include "splitspec.componentName" (dict "root" . "component" "draft")) .Release.Namespace .Values.clusterDomain (int .Values.draft.port) -}}
{{- end -}}

{{- define "splitspec.targetAddress" -}}
{{- printf "%s:%d" (include "splitspec.componentName" (dict "root" . "component" "target")) (int .Values.target.port) -}}
{{- end -}}

{{- define "splitspec.modelArgs" -}}
{{- if .Values.model.path }} --model {{ .Values.model.path | quote }}{{ end -}}
{{- end -}}

{{/* Each service's flags, one shell-quoted line (read by the image's entrypoint). */}}
{{- define "splitspec.routerArgs" -}}
{{- $r := .Values.router -}}
{{- $mtls := include "splitspec.mtls" . -}}
--host 0.0.0.0 --port {{ int $r.port }} --target {{ include "splitspec.targetAddress" . }}
{{- include "splitspec.modelArgs" . }}
{{- if .Values.draft.enabled }} --draft-dns {{ include "splitspec.draftDnsName" . }} --draft-dns-interval {{ $r.draftDnsInterval }} --speculate {{ $r.speculate }}{{ else }} --speculate off{{ end }}
{{- if .Values.tls.enabled }} --tls-cert /etc/splitspec/tls/tls.crt --tls-key /etc/splitspec/tls/tls.key{{ end }}
{{- if $mtls }} --tls-client-ca /etc/splitspec/tls/ca.crt{{ end }}
{{- if .Values.apiKey.enabled }} --api-key-file /etc/splitspec/api-key/api-key{{ end }}
{{- if $r.httpPort }} --http-port {{ int $r.httpPort }}{{ end }}
{{- include "splitspec.logArgs" . }}
{{- if .Values.logging.requests }} --log-requests{{ end }}
{{- with .Values.tracing }}{{ if .endpoint }} --otlp-traces-endpoint {{ .endpoint | quote }} --otlp-service-name {{ .serviceName | quote }}{{ end }}{{ end }}
{{- range $r.extraArgs }} {{ . | quote }}{{ end }}
{{- end -}}

{{/*
Mutual TLS on the router (tls.requireClientCert): "true" or empty. Values that would leave it
off while asking for it, or set a CA that nothing reads, fail the render instead.
*/}}
{{- define "splitspec.mtls" -}}
{{- $t := .Values.tls -}}
{{- if and $t.requireClientCert (not $t.enabled) -}}
{{- fail "tls.requireClientCert needs tls.enabled: mutual TLS is TLS first" -}}
{{- end -}}
{{- if and $t.clientCa (not $t.requireClientCert) -}}
{{- fail "tls.clientCa is set but tls.requireClientCert is off: turn it on or drop the CA" -}}
{{- end -}}
{{- if and $t.clientCa $t.existingSecret -}}
{{- fail "tls.clientCa is unused with tls.existingSecret: put the CA in that Secret's ca.crt key" -}}
{{- end -}}
{{- if $t.requireClientCert }}true{{ end -}}
{{- end -}}

{{- define "splitspec.targetArgs" -}}
{{- $t := .Values.target -}}
--host 0.0.0.0 --port {{ int $t.port }} --device {{ $t.device }} --dtype {{ $t.dtype }} --num-slots {{ int $t.numSlots }}
{{- include "splitspec.modelArgs" . }}
{{- include "splitspec.logArgs" . }}
{{- range $t.extraArgs }} {{ . | quote }}{{ end }}
{{- end -}}

{{- define "splitspec.draftArgs" -}}
{{- $d := .Values.draft -}}
--host 0.0.0.0 --port {{ int $d.port }} --method {{ $d.method }} --device {{ $d.device }} --dtype {{ $d.dtype }} --threads {{ int $d.threads }}
{{- if $d.numSteps }} --num-steps {{ int $d.numSteps }}{{ end }}
{{- if $d.topk }} --topk {{ int $d.topk }}{{ end }}
{{- if $d.numDraftTokens }} --num-draft-tokens {{ int $d.numDraftTokens }}{{ end }}
{{- include "splitspec.modelArgs" . }}
{{- if $d.eagleHead }}
{{- if ne $d.method "eagle" }}{{ fail (printf "draft.eagleHead is for draft.method eagle, not %s: the draft service would refuse it" $d.method) }}{{ end }} --eagle-head {{ $d.eagleHead | quote }}
{{- end }}
{{- include "splitspec.logArgs" . }}
{{- range $d.extraArgs }} {{ . | quote }}{{ end }}
{{- end -}}

{{/* Every service logs alike (values.logging). */}}
{{- define "splitspec.logArgs" -}}
{{- " " }}--log-format {{ .Values.logging.format }} --log-level {{ .Values.logging.level }}
{{- end -}}

{{/* Native gRPC probes (numeric ports: a named port fails the API schema). */}}
{{- define "splitspec.probes" -}}
{{- $port := int .spec.port -}}
{{- /* kubelet's gRPC probe speaks plaintext only: with TLS the port is probed by TCP */ -}}
{{- if and (eq .component "router") .root.Values.tls.enabled -}}
startupProbe:
  tcpSocket: {port: {{ $port }}}
  periodSeconds: {{ .spec.startupProbe.periodSeconds }}
  failureThreshold: {{ .spec.startupProbe.failureThreshold }}
readinessProbe:
  tcpSocket: {port: {{ $port }}}
  periodSeconds: 5
livenessProbe:
  tcpSocket: {port: {{ $port }}}
  periodSeconds: 10
  failureThreshold: 3
{{- else -}}
startupProbe:
  grpc: {port: {{ $port }}}
  periodSeconds: {{ .spec.startupProbe.periodSeconds }}
  failureThreshold: {{ .spec.startupProbe.failureThreshold }}
readinessProbe:
  grpc: {port: {{ $port }}, service: {{ .service }}}
  periodSeconds: 5
  failureThreshold: 2
livenessProbe:
  grpc: {port: {{ $port }}}
  periodSeconds: 10
  timeoutSeconds: 5
  failureThreshold: 3
{{- end }}
{{- end -}}

{{- define "splitspec.image" -}}
{{- printf "%s:%s" .repository .tag -}}
{{- end -}}
