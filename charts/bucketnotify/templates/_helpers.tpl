{{- define "bucketnotify.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "bucketnotify.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/* Labels of every object. helm.sh/chart and managed-by are left out of deploy/base. */}}
{{- define "bucketnotify.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/name: {{ include "bucketnotify.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: bucketnotify
{{- end }}

{{/* bucketnotify.selector (dict "ctx" $ "component" "operator") */}}
{{- define "bucketnotify.selector" -}}
app.kubernetes.io/name: {{ include "bucketnotify.name" .ctx }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{- define "bucketnotify.componentLabels" -}}
{{ include "bucketnotify.labels" .ctx }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{- define "bucketnotify.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
{{- end }}

{{- define "bucketnotify.operatorServiceAccount" -}}
{{- default (printf "%s-operator" (include "bucketnotify.fullname" .)) .Values.serviceAccount.operator.name }}
{{- end }}

{{- define "bucketnotify.deliveryServiceAccount" -}}
{{- default (printf "%s-delivery" (include "bucketnotify.fullname" .)) .Values.serviceAccount.delivery.name }}
{{- end }}

{{/*
The ingest URL written into persistent gateway topics. $(POD_NAMESPACE) is expanded by the
kubelet, so the same manifest works in whatever namespace kustomize or helm puts it.
*/}}
{{- define "bucketnotify.ingestURL" -}}
{{- if .Values.delivery.ingestURL }}
{{- .Values.delivery.ingestURL }}
{{- else }}
{{- printf "http://%s-delivery.$(POD_NAMESPACE).svc:%d" (include "bucketnotify.fullname" .) (int .Values.delivery.port) }}
{{- end }}
{{- end }}

{{/* The default gateway connection, from the gateway Secret. */}}
{{- define "bucketnotify.gatewayEnv" -}}
- name: BUCKETNOTIFY_GATEWAY_ENDPOINT
  valueFrom:
    secretKeyRef: {name: {{ .Values.gateway.secretName }}, key: endpoint}
- name: BUCKETNOTIFY_GATEWAY_ACCESS_KEY
  valueFrom:
    secretKeyRef: {name: {{ .Values.gateway.secretName }}, key: accessKey}
- name: BUCKETNOTIFY_GATEWAY_SECRET_KEY
  valueFrom:
    secretKeyRef: {name: {{ .Values.gateway.secretName }}, key: secretKey}
- name: BUCKETNOTIFY_GATEWAY_REGION
  valueFrom:
    secretKeyRef: {name: {{ .Values.gateway.secretName }}, key: region, optional: true}
- name: BUCKETNOTIFY_GATEWAY_KIND
  valueFrom:
    secretKeyRef: {name: {{ .Values.gateway.secretName }}, key: kind, optional: true}
- name: BUCKETNOTIFY_GATEWAY_RELEASE
  valueFrom:
    secretKeyRef: {name: {{ .Values.gateway.secretName }}, key: release, optional: true}
{{- end }}

{{- define "bucketnotify.podNamespaceEnv" -}}
- name: POD_NAMESPACE
  valueFrom:
    fieldRef: {fieldPath: metadata.namespace}
{{- end }}

{{/* bucketnotify.affinity (dict "ctx" $ "component" "delivery" "values" .Values.delivery) */}}
{{- define "bucketnotify.affinity" -}}
{{- if .values.affinity }}
affinity:
  {{- toYaml .values.affinity | nindent 2 }}
{{- else if eq .values.antiAffinity "soft" }}
affinity:
  podAntiAffinity:
    preferredDuringSchedulingIgnoredDuringExecution:
      - weight: 100
        podAffinityTerm:
          topologyKey: kubernetes.io/hostname
          labelSelector:
            matchLabels:
              {{- include "bucketnotify.selector" . | nindent 14 }}
{{- else if eq .values.antiAffinity "hard" }}
affinity:
  podAntiAffinity:
    requiredDuringSchedulingIgnoredDuringExecution:
      - topologyKey: kubernetes.io/hostname
        labelSelector:
          matchLabels:
            {{- include "bucketnotify.selector" . | nindent 12 }}
{{- end }}
{{- end }}

{{/* bucketnotify.podPlacement: node selector, tolerations, spread, priority. */}}
{{- define "bucketnotify.podPlacement" -}}
{{- with .nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .topologySpreadConstraints }}
topologySpreadConstraints:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .priorityClassName }}
priorityClassName: {{ . }}
{{- end }}
{{- end }}

{{- define "bucketnotify.logEnv" -}}
- name: BUCKETNOTIFY_LOG_FORMAT
  value: {{ .Values.logging.format | quote }}
- name: BUCKETNOTIFY_LOG_LEVEL
  value: {{ .Values.logging.level | quote }}
{{- end }}

{{- define "bucketnotify.webhookSecret" -}}
{{- .Values.webhook.certificate.secretName | default (printf "%s-webhook-tls" (include "bucketnotify.fullname" .)) }}
{{- end }}
