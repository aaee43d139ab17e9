{{/*
Names, labels and the pieces every pod of the chart shares.
*/}}

{{- define "airuntime.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Full name: <release>-<chart>, or the release name when it already contains the chart
name. Kept to 40 characters so that "<fullname>-control-plane-metrics" style names stay
valid DNS labels.
*/}}
{{- define "airuntime.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 40 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 40 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "airuntime.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels of every object. */}}
{{- define "airuntime.labels" -}}
helm.sh/chart: {{ include "airuntime.chart" . }}
app.kubernetes.io/name: {{ include "airuntime.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: airuntime
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* Selector labels of one component: (dict "ctx" $ "component" "control-plane"). */}}
{{- define "airuntime.selectorLabels" -}}
app.kubernetes.io/name: {{ include "airuntime.name" .ctx }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{/* Labels of one component's objects: common labels + component. */}}
{{- define "airuntime.componentLabels" -}}
{{ include "airuntime.labels" .ctx }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{/* The airuntime image. */}}
{{- define "airuntime.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{- define "airuntime.controlPlane.fullname" -}}
{{- printf "%s-control-plane" (include "airuntime.fullname" .) }}
{{- end }}

{{- define "airuntime.operator.fullname" -}}
{{- printf "%s-operator" (include "airuntime.fullname" .) }}
{{- end }}

{{- define "airuntime.valkey.fullname" -}}
{{- printf "%s-valkey" (include "airuntime.fullname" .) }}
{{- end }}

{{- define "airuntime.controlPlane.serviceAccountName" -}}
{{- if .Values.controlPlane.serviceAccount.create }}
{{- default (include "airuntime.controlPlane.fullname" .) .Values.controlPlane.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.controlPlane.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "airuntime.operator.serviceAccountName" -}}
{{- if .Values.operator.serviceAccount.create }}
{{- default (include "airuntime.operator.fullname" .) .Values.operator.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.operator.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* Secret and key holding the Redis URL. */}}
{{- define "airuntime.redis.secretName" -}}
{{- if .Values.redis.valkey.enabled }}
{{- printf "%s-redis" (include "airuntime.fullname" .) }}
{{- else }}
{{- required "redis.external.secretName is required when redis.valkey.enabled is false" .Values.redis.external.secretName }}
{{- end }}
{{- end }}

{{- define "airuntime.redis.secretKey" -}}
{{- if .Values.redis.valkey.enabled }}url{{ else }}{{ required "redis.external.key is required" .Values.redis.external.key }}{{ end }}
{{- end }}

{{/* AIRUNTIME_REDIS_URL from the Secret: the only way the URL reaches a pod; with
redis.cluster, AIRUNTIME_REDIS_CLUSTER=1 too (the operator passes it to runtime pods). */}}
{{- define "airuntime.redisUrlEnv" -}}
- name: AIRUNTIME_REDIS_URL
  valueFrom:
    secretKeyRef:
      name: {{ include "airuntime.redis.secretName" . }}
      key: {{ include "airuntime.redis.secretKey" . }}
{{- if .Values.redis.cluster }}
- name: AIRUNTIME_REDIS_CLUSTER
  value: "1"
{{- end }}
{{- end }}

{{/* Tokens file Secret name and key. */}}
{{- define "airuntime.tokens.secretName" -}}
{{- default (printf "%s-tokens" (include "airuntime.fullname" .)) .Values.auth.existingSecret }}
{{- end }}

{{- define "airuntime.tokens.secretKey" -}}
{{- if .Values.auth.existingSecret }}{{ .Values.auth.existingSecretKey }}{{ else }}tokens.yaml{{ end }}
{{- end }}

{{/* Tenants file ConfigMap name ("" = no tenants file). */}}
{{- define "airuntime.tenants.configMapName" -}}
{{- if .Values.controlPlane.tenantsExistingConfigMap }}
{{- .Values.controlPlane.tenantsExistingConfigMap }}
{{- else if .Values.controlPlane.tenants }}
{{- printf "%s-tenants" (include "airuntime.fullname" .) }}
{{- end }}
{{- end }}

{{/* Pod-level security context. */}}
{{- define "airuntime.podSecurityContext" -}}
{{ toYaml .Values.podSecurityContext }}
{{- end }}

{{/* Container-level security context. */}}
{{- define "airuntime.containerSecurityContext" -}}
{{ toYaml .Values.containerSecurityContext }}
{{- end }}

{{/* The writable /tmp every container gets (the root filesystem is read-only). */}}
{{- define "airuntime.tmpVolume" -}}
- name: tmp
  emptyDir:
    sizeLimit: {{ .Values.tmpSizeLimit }}
{{- end }}

{{- define "airuntime.tmpVolumeMount" -}}
- name: tmp
  mountPath: /tmp
{{- end }}

{{- define "airuntime.imagePullSecrets" -}}
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{/* Namespaces served by the operator when it is namespaced ([] = cluster-wide). */}}
{{- define "airuntime.operator.clusterwide" -}}
{{- if not .Values.operator.watchNamespaces }}true{{ end }}
{{- end }}

{{/* Runtime token Secret name and key (AIRUNTIME_RUNTIME_TOKEN). */}}
{{- define "airuntime.runtimeToken.secretName" -}}
{{- default (printf "%s-runtime-token" (include "airuntime.fullname" .)) .Values.runtimeToken.existingSecret }}
{{- end }}

{{- define "airuntime.runtimeToken.secretKey" -}}
{{- if .Values.runtimeToken.existingSecret }}{{ .Values.runtimeToken.existingSecretKey }}{{ else }}token{{ end }}
{{- end }}

{{/* Secrets-keys Secret name and key (AIRUNTIME_SECRETS_KEYS). */}}
{{- define "airuntime.secretsKeys.secretName" -}}
{{- default (printf "%s-secrets-keys" (include "airuntime.fullname" .)) .Values.secretsKeys.existingSecret }}
{{- end }}

{{- define "airuntime.secretsKeys.secretKey" -}}
{{- if .Values.secretsKeys.existingSecret }}{{ .Values.secretsKeys.existingSecretKey }}{{ else }}keys{{ end }}
{{- end }}

{{/* The platform's trust settings, identical on the control plane, the operator and
(through the operator) every runtime pod. */}}
{{- define "airuntime.handlerPolicyEnv" -}}
- name: AIRUNTIME_PYTHON_HANDLER_MODULES
  value: {{ join "," .Values.pythonHandlerModules | quote }}
- name: AIRUNTIME_HTTP_HANDLER_DENY_CIDRS
  value: {{ join "," .Values.httpHandlerDenyCidrs | quote }}
- name: AIRUNTIME_HTTP_HANDLER_ALLOW
  value: {{ join "," .Values.httpHandlerAllow | quote }}
- name: AIRUNTIME_MODEL_PROVIDERS
  value: {{ if .Values.modelProviders }}{{ toJson .Values.modelProviders | quote }}{{ else }}""{{ end }}
{{- end }}

{{/* The log's level and format: the control plane's, and (through the operator) every
runtime pod's; the operator writes its own log in the same format. */}}
{{- define "airuntime.logEnv" -}}
{{- if not (has .Values.logging.format (list "text" "json")) }}
{{- fail (printf "logging.format must be text or json, not %q" .Values.logging.format) }}
{{- end }}
{{- if not (has (upper .Values.logging.level) (list "DEBUG" "INFO" "WARNING" "ERROR")) }}
{{- fail (printf "logging.level must be DEBUG, INFO, WARNING or ERROR, not %q" .Values.logging.level) }}
{{- end -}}
- name: AIRUNTIME_LOG_LEVEL
  value: {{ upper .Values.logging.level | quote }}
- name: AIRUNTIME_LOG_FORMAT
  value: {{ .Values.logging.format | quote }}
{{- end }}

{{/* Namespaces where runtime pods of this release's operator run (release first). */}}
{{- define "airuntime.runtimeNamespaces" -}}
{{- toJson (uniq (prepend .Values.operator.watchNamespaces .Release.Namespace)) }}
{{- end }}

{{/* Labels every runtime pod the operator creates carries. */}}
{{- define "airuntime.runtimePodLabels" -}}
app.kubernetes.io/name: airuntime-runtime
app.kubernetes.io/managed-by: airuntime-operator
{{- end }}

{{/* The durable history's DSN Secret (history.existingSecret, or the chart's own). */}}
{{- define "airuntime.history.secretName" -}}
{{- default (printf "%s-history" (include "airuntime.fullname" .)) .Values.history.existingSecret }}
{{- end }}

{{/* AIRUNTIME_HISTORY_* of the control plane: the DSN from its Secret when one is given. */}}
{{- define "airuntime.historyEnv" -}}
{{- $h := .Values.history -}}
{{- if or $h.dsn $h.existingSecret }}
- name: AIRUNTIME_HISTORY_DSN
  valueFrom:
    secretKeyRef:
      name: {{ include "airuntime.history.secretName" . }}
      key: {{ if $h.existingSecret }}{{ $h.existingSecretKey }}{{ else }}dsn{{ end }}
- name: AIRUNTIME_HISTORY_AUTO_MIGRATE
  value: {{ $h.autoMigrate | quote }}
{{- end }}
{{- end }}
