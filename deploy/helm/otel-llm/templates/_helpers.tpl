{{- define "otel-llm.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "otel-llm.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "otel-llm.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: {{ include "otel-llm.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{- define "otel-llm.selectorLabels" -}}
app.kubernetes.io/name: {{ include "otel-llm.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: replica
{{- end -}}

{{- define "otel-llm.collectorSelectorLabels" -}}
app.kubernetes.io/name: {{ include "otel-llm.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: collector
{{- end -}}

{{/* The headless Service the Collector's DNS resolver reads: one A record per ready replica. */}}
{{- define "otel-llm.headless" -}}
{{- printf "%s-headless" (include "otel-llm.fullname" .) -}}
{{- end -}}

{{- define "otel-llm.headlessFQDN" -}}
{{- printf "%s.%s.svc.%s" (include "otel-llm.headless" .) .Release.Namespace .Values.clusterDomain -}}
{{- end -}}

{{/* "host:port" -> port */}}
{{- define "otel-llm.port" -}}
{{- last (splitList ":" .) -}}
{{- end -}}

{{/* The Collector config: values' collector.config with the resolver pointed at the headless Service. */}}
{{- define "otel-llm.collectorConfig" -}}
{{- $config := deepCopy .Values.collector.config -}}
{{- $dns := $config.exporters.load_balancing.resolver.dns -}}
{{- if not $dns.hostname -}}
{{- $_ := set $dns "hostname" (include "otel-llm.headlessFQDN" .) -}}
{{- end -}}
{{- if not $dns.port -}}
{{- $_ := set $dns "port" (include "otel-llm.port" .Values.config.receivers.otlp.protocols.grpc.endpoint) -}}
{{- end -}}
{{- toYaml $config -}}
{{- end -}}
