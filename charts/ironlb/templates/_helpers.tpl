{{/* Chart name, truncated to fit DNS label limits. */}}
{{- define "ironlb.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Fully qualified app name: the release name unless it already contains the chart name. */}}
{{- define "ironlb.fullname" -}}
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

{{- define "ironlb.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels common to every object. */}}
{{- define "ironlb.labels" -}}
helm.sh/chart: {{ include "ironlb.chart" . }}
{{ include "ironlb.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "ironlb.selectorLabels" -}}
app.kubernetes.io/name: {{ include "ironlb.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "ironlb.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{- define "ironlb.controllerServiceAccount" -}}
{{- default (printf "%s-controller" (include "ironlb.fullname" .)) .Values.controller.serviceAccount.name }}
{{- end }}

{{- define "ironlb.speakerServiceAccount" -}}
{{- default (printf "%s-speaker" (include "ironlb.fullname" .)) .Values.speaker.serviceAccount.name }}
{{- end }}

{{/* Names shared between the controller (which creates them) and the speaker. */}}
{{- define "ironlb.memberlistSecret" -}}
{{- printf "%s-memberlist" (include "ironlb.fullname" .) }}
{{- end }}
{{- define "ironlb.webhookService" -}}
{{- printf "%s-webhook-service" (include "ironlb.fullname" .) }}
{{- end }}
{{- define "ironlb.webhookConfiguration" -}}
{{- printf "%s-webhook-configuration" (include "ironlb.fullname" .) }}
{{- end }}
{{- define "ironlb.webhookCertSecret" -}}
{{- printf "%s-webhook-cert" (include "ironlb.fullname" .) }}
{{- end }}
