{{/*
One Deployment per service. Called with (dict "root" $ "component" NAME "spec" VALUES
"image" IMAGE "service" GRPC_SERVICE_NAME "replicas" true|false).
*/}}
{{- define "splitspec.deployment" -}}
{{- $root := .root -}}
{{- $spec := .spec -}}
apiVersion: apps/v1
kind: Deployment
metadata:
  name: {{ include "splitspec.componentName" . }}
  labels:
    {{- include "splitspec.labels" . | nindent 4 }}
spec:
  {{- if .replicas }}
  replicas: {{ int $spec.replicas }}
  {{- end }}
  {{- if eq .component "draft" }}
  strategy: {type: RollingUpdate, rollingUpdate: {maxSurge: 1, maxUnavailable: 0}}
  {{- else }}
  strategy: {type: Recreate}  # the router owns the target's KV slots: never two at once
  {{- end }}
  selector:
    matchLabels:
      {{- include "splitspec.selectorLabels" . | nindent 6 }}
  template:
    metadata:
      labels:
        {{- include "splitspec.selectorLabels" . | nindent 8 }}
      annotations:
        checksum/config: {{ include (print $root.Template.BasePath "/configmap.yaml") $root | sha256sum }}
        {{- with $spec.podAnnotations }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
    spec:
      {{- with $root.Values.imagePullSecrets }}
      imagePullSecrets:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      securityContext:
        {{- toYaml $root.Values.podSecurityContext | nindent 8 }}
      terminationGracePeriodSeconds: {{ int $spec.terminationGracePeriodSeconds }}
      enableServiceLinks: false
      containers:
        - name: {{ .component }}
          image: {{ include "splitspec.image" .image | quote }}
          imagePullPolicy: {{ $root.Values.images.pullPolicy }}
          args: [{{ .component | quote }}]
          env:
            - {name: SPLITSPEC_ARGS_FILE, value: "/etc/splitspec/args/{{ .component }}.args"}
            - {name: SPLITSPEC_CACHE, value: /var/cache/splitspec}
            - {name: HOME, value: /tmp}
          ports:
            - {name: grpc, containerPort: {{ int $spec.port }}, protocol: TCP}
            {{- if and (eq .component "router") $spec.httpPort }}
            - {name: http, containerPort: {{ int $spec.httpPort }}, protocol: TCP}
            {{- end }}
          {{- include "splitspec.probes" . | nindent 10 }}
          resources:
            {{- $resources := deepCopy $spec.resources }}
            {{- if gt (int (default 0 $spec.gpus)) 0 }}
            {{- $limits := default dict $resources.limits }}
            {{- $_ := set $limits "nvidia.com/gpu" (int $spec.gpus) }}
            {{- $_ := set $resources "limits" $limits }}
            {{- end }}
            {{- toYaml $resources | nindent 12 }}
          securityContext:
            {{- toYaml $root.Values.containerSecurityContext | nindent 12 }}
          volumeMounts:
            - {name: args, mountPath: /etc/splitspec/args, readOnly: true}
            - {name: cache, mountPath: /var/cache/splitspec}
            - {name: tmp, mountPath: /tmp}
            {{- if $root.Values.model.volume }}
            - {name: model, mountPath: {{ $root.Values.model.mountPath }}, readOnly: true}
            {{- end }}
            {{- if and (eq .component "router") $root.Values.tls.enabled }}
            - {name: tls, mountPath: /etc/splitspec/tls, readOnly: true}
            {{- end }}
            {{- if and (eq .component "router") $root.Values.apiKey.enabled }}
            - {name: api-key, mountPath: /etc/splitspec/api-key, readOnly: true}
            {{- end }}
      volumes:
        - name: args
          configMap: {name: {{ include "splitspec.fullname" $root }}-args}
        - name: cache
          {{- toYaml $root.Values.cache.volume | nindent 10 }}
        - name: tmp
          emptyDir: {sizeLimit: 1Gi}
        {{- with $root.Values.model.volume }}
        - name: model
          {{- toYaml . | nindent 10 }}
        {{- end }}
        {{- if and (eq .component "router") $root.Values.tls.enabled }}
        - name: tls
          secret:
            secretName: {{ include "splitspec.tlsSecret" $root }}
            # Named keys: a Secret without one (an existingSecret with no ca.crt under
            # tls.requireClientCert) stops the pod at its mount, saying which key is missing.
            items:
              - {key: tls.crt, path: tls.crt}
              - {key: tls.key, path: tls.key}
              {{- if include "splitspec.mtls" $root }}
              - {key: ca.crt, path: ca.crt}
              {{- end }}
        {{- end }}
        {{- if and (eq .component "router") $root.Values.apiKey.enabled }}
        - name: api-key
          secret: {secretName: {{ include "splitspec.apiKeySecret" $root }}}
        {{- end }}
      {{- with $spec.nodeSelector }}
      nodeSelector:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- with $spec.tolerations }}
      tolerations:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- with $spec.affinity }}
      affinity:
        {{- toYaml . | nindent 8 }}
      {{- end }}
{{- end -}}

{{- define "splitspec.tlsSecret" -}}
{{- default (printf "%s-tls" (include "splitspec.fullname" .)) .Values.tls.existingSecret -}}
{{- end -}}

{{- define "splitspec.apiKeySecret" -}}
{{- default (printf "%s-api-key" (include "splitspec.fullname" .)) .Values.apiKey.existingSecret -}}
{{- end -}}
