{{/*
The external metrics listener's CA and serving certificate, made once per render (the Secret and the
APIService's caBundle must agree) and kept from the Secret on upgrades.
*/}}
{{- define "mqbalance.externalMetrics.name" -}}
{{ include "mqbalance.fullname" . }}-external-metrics
{{- end }}

{{- define "mqbalance.externalMetrics.certs" -}}
{{- if not (hasKey .Values "_externalMetricsCerts") }}
{{- $name := include "mqbalance.externalMetrics.name" . }}
{{- $host := printf "%s.%s.svc" $name .Release.Namespace }}
{{- $existing := lookup "v1" "Secret" .Release.Namespace $name }}
{{- $certs := dict }}
{{- if and $existing (index ($existing.data | default dict) "ca.crt") }}
{{- $_ := set $certs "ca" (index $existing.data "ca.crt" | b64dec) }}
{{- $_ := set $certs "cert" (index $existing.data "tls.crt" | b64dec) }}
{{- $_ := set $certs "key" (index $existing.data "tls.key" | b64dec) }}
{{- else }}
{{- $ca := genCA (printf "%s-ca" $name) 3650 }}
{{- $signed := genSignedCert $host nil (list $host $name (printf "%s.%s" $name .Release.Namespace)) 3650 $ca }}
{{- $_ := set $certs "ca" $ca.Cert }}
{{- $_ := set $certs "cert" $signed.Cert }}
{{- $_ := set $certs "key" $signed.Key }}
{{- end }}
{{- $_ := set .Values "_externalMetricsCerts" $certs }}
{{- end }}
{{- toJson (get .Values "_externalMetricsCerts") }}
{{- end }}
