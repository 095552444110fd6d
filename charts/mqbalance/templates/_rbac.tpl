{{/*
RBAC rules, written once and used by the Role or the ClusterRole that grants them.
Each verb is one the operator or the sidecar issues (see docs/deploy.md, "Permissions").
*/}}

{{/* Namespaced rules of the operator, in every namespace it watches. */}}
{{- define "mqbalance.operator.namespacedRules" -}}
# Topics: watched; their status written.
- apiGroups: [mqbalance.io]
  resources: [topics]
  verbs: [list, watch]
# ConsumerGroups: watched; patched once to remove the finalizer operator 0.1 (kopf) added.
- apiGroups: [mqbalance.io]
  resources: [consumergroups]
  verbs: [list, watch, patch]
# OffsetResets: watched; their status written (the phases, the preview).
- apiGroups: [mqbalance.io]
  resources: [offsetresets]
  verbs: [list, watch]
- apiGroups: [mqbalance.io]
  resources: [topics/status, consumergroups/status, offsetresets/status]
  verbs: [patch]
# The ConfigMaps "<group>-assignment" are owned by their ConsumerGroup with blockOwnerDeletion,
# which clusters enforcing OwnerReferencesPermissionEnforcement allow only with this.
- apiGroups: [mqbalance.io]
  resources: [consumergroups/finalizers]
  verbs: [update]
# Member pods of each group.
- apiGroups: [""]
  resources: [pods]
  verbs: [list, watch]
# The published assignments: read, created, replaced with the resourceVersion last read; the
# operator watches them to notice edits. Deletion is left to the garbage collector.
- apiGroups: [""]
  resources: [configmaps]
  verbs: [get, list, watch, create, update]
# Events about rebalances and invalid specs (core v1 Events).
- apiGroups: [""]
  resources: [events]
  verbs: [create]
# The member Leases "<pod>-mqbalance-member" the sidecars renew (spec.handover Release/Orderly):
# watched (label mqbalance.io/member=true) to tell a member that stopped renewing, read only.
- apiGroups: [coordination.k8s.io]
  resources: [leases]
  verbs: [list, watch]
{{- with .Values.operator.lag.aclSecrets }}
# The Secrets Topics name in spec.nameServer.aclSecretRef, only these: their keys sign the offset reads.
- apiGroups: [""]
  resources: [secrets]
  resourceNames:
    {{- range . }}
    - {{ . | quote }}
    {{- end }}
  verbs: [get]
{{- end }}
{{- end }}

{{/* Cluster-scoped rules of the operator, whatever it watches. */}}
{{- define "mqbalance.operator.clusterRules" -}}
# Nodes: a member's zone is its node's zone label.
- apiGroups: [""]
  resources: [nodes]
  verbs: [list, watch]
{{- end }}

{{/* Rules of the sidecar in a consumer namespace: its groups' assignments and the Topics. */}}
{{- define "mqbalance.sidecar.rules" -}}
- apiGroups: [""]
  resources: [configmaps]
  {{- with .Values.sidecar.groups }}
  # Only the listed groups' assignments; a list or watch must name the ConfigMap (fieldSelector metadata.name).
  resourceNames:
    {{- range . }}
    - {{ printf "%s-assignment" . }}
    {{- end }}
  {{- end }}
  verbs: [get, list, watch]
{{- with .Values.sidecar.groups }}
# Release acknowledgements (spec.handover): each pod writes its own key into its groups'
# "<group>-releases" ConfigMaps, and may patch nothing else.
- apiGroups: [""]
  resources: [configmaps]
  resourceNames:
    {{- range . }}
    - {{ printf "%s-releases" . }}
    {{- end }}
  verbs: [patch]
# Time-bounded ownership (spec.handover Release/Orderly): each pod renews its own member Lease
# "<pod>-mqbalance-member". Pod names are not known in advance, and create cannot be narrowed by name.
- apiGroups: [coordination.k8s.io]
  resources: [leases]
  verbs: [get, create, update]
{{- end }}
{{- if .Values.sidecar.watchTopics }}
- apiGroups: [mqbalance.io]
  resources: [topics]
  verbs: [get, list, watch]
{{- end }}
{{- end }}
