{{/* The chart name, overridable with nameOverride. */}}
{{- define "mqbalance.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Base name of every resource: "<release>-<chart>", or the release name when it already holds the chart name. */}}
{{- define "mqbalance.fullname" -}}
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

{{- define "mqbalance.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels on every object. */}}
{{- define "mqbalance.labels" -}}
helm.sh/chart: {{ include "mqbalance.chart" . }}
{{ include "mqbalance.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: mqbalance
{{- end }}

{{- define "mqbalance.selectorLabels" -}}
app.kubernetes.io/name: {{ include "mqbalance.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* Selector of the operator pod. */}}
{{- define "mqbalance.operator.selectorLabels" -}}
{{ include "mqbalance.selectorLabels" . }}
app.kubernetes.io/component: operator
{{- end }}

{{- define "mqbalance.operator.labels" -}}
{{ include "mqbalance.labels" . }}
app.kubernetes.io/component: operator
{{- end }}

{{- define "mqbalance.sidecar.labels" -}}
{{ include "mqbalance.labels" . }}
app.kubernetes.io/component: sidecar
{{- end }}

{{- define "mqbalance.operator.serviceAccountName" -}}
{{- default (printf "%s-operator" (include "mqbalance.fullname" .)) .Values.operator.serviceAccount.name }}
{{- end }}

{{/* The operator's leader-election Lease. */}}
{{- define "mqbalance.operator.leaseName" -}}
{{- default (printf "%s-operator" (include "mqbalance.fullname" .)) .Values.operator.leaderElection.leaseName }}
{{- end }}

{{/*
How operator pods coordinate: "Lease <name> with <n> shard(s) by group", or "no leader election". Pods that
disagree on it do not see each other's Leases, so during a rollout old and new pods would work on
the same groups at once.
*/}}
{{- define "mqbalance.operator.coordination" -}}
{{- if .lease }}
{{- printf "Lease %q with %d shard(s)" .lease (int .shards) }}
{{- if gt (int .shards) 1 }}{{ printf " by %s" .shardBy }}{{ end }}
{{- else }}
{{- print "no leader election" }}
{{- end }}
{{- end }}

{{/*
Refuses an upgrade that changes how running operator pods coordinate (leader election, the Lease's
name, operator.leaderElection.shards or shardBy) while the new values roll pods out next to the old ones
(RollingUpdate). Reads the Deployment from the cluster, so `helm template` and client-side dry runs
skip the check.
*/}}
{{- define "mqbalance.operator.checkCoordinationChange" -}}
{{- $existing := lookup "apps/v1" "Deployment" .Release.Namespace (printf "%s-operator" (include "mqbalance.fullname" .)) }}
{{- if and $existing .Values.operator.leaderElection.enabled (gt (int .Values.operator.replicas) 0) }}
{{- $running := max (dig "spec" "replicas" 0 $existing) (dig "status" "replicas" 0 $existing) }}
{{- $old := dict "lease" "" "shards" 1 "shardBy" "group" }}
{{- range $existing.spec.template.spec.containers }}
{{- if eq .name "operator" }}
{{- range .args }}
{{- if hasPrefix "--leader-election=" . }}{{ $_ := set $old "lease" (trimPrefix "--leader-election=" .) }}{{ end }}
{{- if hasPrefix "--shards=" . }}{{ $_ := set $old "shards" (trimPrefix "--shards=" . | atoi) }}{{ end }}
{{- if hasPrefix "--shard-by=" . }}{{ $_ := set $old "shardBy" (trimPrefix "--shard-by=" .) }}{{ end }}
{{- end }}
{{- end }}
{{- end }}
{{- $new := dict "lease" (include "mqbalance.operator.leaseName" .) "shards" (int .Values.operator.leaderElection.shards) "shardBy" .Values.operator.leaderElection.shardBy }}
{{- $before := include "mqbalance.operator.coordination" $old }}
{{- $after := include "mqbalance.operator.coordination" $new }}
{{- if and (gt (int64 $running) 0) (ne $before $after) }}
{{- $what := printf "the %d running operator pod(s) coordinate through %s, these values through %s" (int64 $running) $before $after }}
{{- $why := "during a rolling update pods of both would work on the same groups at once" }}
{{- $fix := "Scale the operator to 0 first (helm upgrade --reuse-values --set operator.replicas=0), wait for its pods to go, then upgrade with the new values" }}
{{- fail (printf "operator.leaderElection: %s; %s. %s." $what $why $fix) }}
{{- end }}
{{- end }}
{{- end }}

{{- define "mqbalance.sidecar.serviceAccountName" -}}
{{- default (printf "%s-sidecar" (include "mqbalance.fullname" .)) .Values.sidecar.serviceAccount.name }}
{{- end }}

{{/* Namespaces that get the sidecar ServiceAccount, Role and RoleBinding. */}}
{{- define "mqbalance.sidecar.namespaces" -}}
{{- $namespaces := .Values.sidecar.namespaces | default (list .Release.Namespace) }}
{{- toJson (uniq $namespaces) }}
{{- end }}

{{/* The ServiceAccounts consumer pods run as: the chart's sidecar account and sidecar.serviceAccounts. */}}
{{- define "mqbalance.sidecar.serviceAccounts" -}}
{{- toJson (uniq (prepend .Values.sidecar.serviceAccounts (include "mqbalance.sidecar.serviceAccountName" .))) }}
{{- end }}

{{/* Those accounts in every sidecar namespace, as the API server names them, as a CEL list. */}}
{{- define "mqbalance.sidecar.usernames" -}}
{{- $names := list }}
{{- $accounts := include "mqbalance.sidecar.serviceAccounts" . | fromJsonArray }}
{{- range $namespace := include "mqbalance.sidecar.namespaces" . | fromJsonArray }}
{{- range $account := $accounts }}
{{- $names = append $names (printf "system:serviceaccount:%s:%s" $namespace $account | squote) }}
{{- end }}
{{- end }}
{{- printf "[%s]" (join ", " $names) }}
{{- end }}

{{/*
Non-empty when the chart installs its ValidatingAdmissionPolicies: asked for, and served by the
cluster (admissionregistration.k8s.io/v1 from Kubernetes 1.30; older servers get RBAC alone).
*/}}
{{- define "mqbalance.admissionPolicies" -}}
{{- if and .Values.admissionPolicies.enabled (semverCompare ">=1.30-0" .Capabilities.KubeVersion.Version) }}true{{ end }}
{{- end }}

{{- define "mqbalance.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
{{- end }}

{{/*
The sidecar container for a consumer pod. A chart that depends on this one adds it to its
Deployment's containers:

  containers:
    - name: app
      ...
    {{- include "mqbalance.sidecar.container" (dict "root" $ "group" "orders-consumer") | nindent 4 }}

and sets `serviceAccountName: {{ include "mqbalance.sidecar.serviceAccountName" $ }}` plus the label
mqbalance.io/sidecar: "true" (scraped by the optional PodMonitor) on the pod template, and a
terminationGracePeriodSeconds above sidecar.drainTimeoutSeconds (15 s more).
"group" is the ConsumerGroup resource name (comma-separate several); "zone" optionally names the
pod's zone for the producer's machine-room selector.
The one source of this container is mqbalance/injector/spec.py (sidecar_container), which the
injection webhook uses; tests/unit/test_injector_spec.py checks that this renders the same.
*/}}
{{- define "mqbalance.sidecar.container" -}}
{{- $root := .root }}
{{- $sidecar := $root.Values.sidecar }}
- name: mqbalance-sidecar
  image: {{ include "mqbalance.image" $root }}
  imagePullPolicy: {{ $root.Values.image.pullPolicy }}
  args: [sidecar]
  env:
    - name: POD_NAME
      valueFrom:
        fieldRef:
          fieldPath: metadata.name
    - name: POD_NAMESPACE
      valueFrom:
        fieldRef:
          fieldPath: metadata.namespace
    - name: POD_UID
      valueFrom:
        fieldRef:
          fieldPath: metadata.uid
    - name: POD_IP
      valueFrom:
        fieldRef:
          fieldPath: status.podIP
    - name: MQBALANCE_GROUP
      value: {{ required "mqbalance.sidecar.container needs a group (the ConsumerGroup name)" .group | quote }}
    - name: MQBALANCE_SIDECAR_PORT
      value: {{ $sidecar.port | quote }}
    # Metrics on the pod's IP (Prometheus, the probes) and loopback (port-forward), not every address.
    - name: MQBALANCE_METRICS_HOST
      value: "$(POD_IP),127.0.0.1"
    - name: MQBALANCE_METRICS_PORT
      value: {{ $sidecar.metricsPort | quote }}
    - name: MQBALANCE_FAULT_TABLE
      value: {{ $sidecar.faultTable | quote }}
    - name: MQBALANCE_FAULT_TOLERANCE
      value: {{ $sidecar.faultTolerance | quote }}
    {{- if not $sidecar.watchTopics }}
    - name: MQBALANCE_NO_TOPICS
      value: "true"
    {{- end }}
    {{- with .zone }}
    - name: MQBALANCE_ZONE
      value: {{ . | quote }}
    {{- end }}
  ports:
    - name: mqb-metrics
      containerPort: {{ $sidecar.metricsPort }}
      protocol: TCP
  # Alive and Ready as soon as the metrics port answers: a sidecar that crashes at start then never
  # lets its pod turn Ready between restarts. Never on /readyz (an assignment): a pod gets queues
  # only once it is Ready.
  livenessProbe:
    httpGet:
      path: /metrics
      port: mqb-metrics
  readinessProbe:
    httpGet:
      path: /metrics
      port: mqb-metrics
    periodSeconds: 2
  # A terminating pod keeps its sidecar until its application has released its queues and the
  # operator has handed them over (spec.handover); returns at once when the group has no handover.
  lifecycle:
    preStop:
      exec:
        command: [mqbalance, drain, --port, {{ $sidecar.port | quote }}, --timeout, {{ $sidecar.drainTimeoutSeconds | quote }}]
  resources:
    {{- toYaml $sidecar.resources | nindent 4 }}
  securityContext:
    {{- toYaml $sidecar.securityContext | nindent 4 }}
{{- end }}

{{- define "mqbalance.replay.serviceAccountName" -}}
{{- default (printf "%s-replay" (include "mqbalance.fullname" .)) .Values.replay.serviceAccountName }}
{{- end }}

{{- define "mqbalance.replay.namespace" -}}
{{- $namespace := default (printf "%s-replay" .Release.Namespace) .Values.replay.namespace }}
{{- if eq $namespace .Release.Namespace }}
{{- fail (printf "replay.namespace: %q is the release namespace; the replay's driver creates pods, which there could run as the operator's ServiceAccount or mount the injector's keys: give it a namespace of its own (empty means %q)" $namespace (printf "%s-replay" .Release.Namespace)) }}
{{- end }}
{{- $namespace }}
{{- end }}

{{- define "mqbalance.replay.labels" -}}
{{ include "mqbalance.labels" . }}
app.kubernetes.io/component: replay
{{- end }}
