{{- define "intake.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "intake.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "intake.labels" -}}
{{ include "intake.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/* intake.seconds: a Go duration of the simple forms 90s, 2m, 1h as seconds. */}}
{{- define "intake.seconds" -}}
{{- $d := toString . -}}
{{- if not (regexMatch "^[0-9]+(ms|s|m|h)$" $d) -}}{{ fail (printf "config.drain %q: use one whole number of s, m or h (e.g. 90s)" $d) }}
{{- else if hasSuffix "h" $d -}}{{ mul (trimSuffix "h" $d | atoi) 3600 }}
{{- else if hasSuffix "ms" $d -}}0
{{- else if hasSuffix "m" $d -}}{{ mul (trimSuffix "m" $d | atoi) 60 }}
{{- else if hasSuffix "s" $d -}}{{ trimSuffix "s" $d | atoi }}
{{- else -}}{{ fail (printf "config.drain %q: use a whole number of s, m or h" $d) }}
{{- end -}}
{{- end -}}

{{/* intake.checks: the chart's config must fit a StatefulSet. */}}
{{- define "intake.checks" -}}
{{- if .Values.config.worker_id -}}
{{- fail "config.worker_id must be unset: each pod's name is its worker_id" -}}
{{- end -}}
{{- $listen := default "" (get (default dict .Values.config.http) "listen") -}}
{{- if not (hasPrefix "0.0.0.0:" $listen) -}}
{{- fail "config.http.listen must be 0.0.0.0:<port> so the kubelet's probes reach /healthz and /readyz" -}}
{{- end -}}
{{- if ne (default "" (get (default dict .Values.config.spool) "dir")) "/var/lib/intake/spool" -}}
{{- fail "config.spool.dir must be /var/lib/intake/spool (the spool volume)" -}}
{{- end -}}
{{- $drain := include "intake.seconds" (default "30s" .Values.config.drain) | atoi -}}
{{- if le (int .Values.terminationGracePeriodSeconds) (add $drain 10) -}}
{{- fail (printf "terminationGracePeriodSeconds %d must exceed config.drain (%ds) by more than 10s" (int .Values.terminationGracePeriodSeconds) $drain) -}}
{{- end -}}
{{- end -}}

{{- define "intake.port" -}}
{{- .Values.config.http.listen | splitList ":" | last -}}
{{- end -}}

{{- /* Where the alerts' runbook links and NOTES.txt point: docs/runbook.md
in the repository (the base configs/prometheus/alerts.yml carries), or
prometheusRule.runbookBaseURL. */}}
{{- define "intake.defaultRunbookBaseURL" -}}
{{ .Chart.Home }}/blob/main/docs/runbook.md
{{- end }}
{{- define "intake.runbookBaseURL" -}}
{{ .Values.prometheusRule.runbookBaseURL | default (include "intake.defaultRunbookBaseURL" .) | trimSuffix "/" }}
{{- end }}
