{{/* The chart name, overridable. */}}
{{- define "kuberl.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The full name of the release's objects: <release>-kuberl, or the release name when it already says kuberl. */}}
{{/*
Name of a cluster-scoped object (ClusterRoles, the status policy): the fullname, and in the namespaced install mode
(watchNamespaces set) the release namespace after it, so that releases in several namespaces do not collide.
*/}}
{{- define "kuberl.clusterScopedName" -}}
{{- if .Values.watchNamespaces }}
{{- printf "%s-%s" (include "kuberl.fullname" .) .Release.Namespace | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- include "kuberl.fullname" . }}
{{- end }}
{{- end }}

{{- define "kuberl.fullname" -}}
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

{{- define "kuberl.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels on every object of the release, without a component. */}}
{{- define "kuberl.baseLabels" -}}
helm.sh/chart: {{ include "kuberl.chart" . }}
app.kubernetes.io/name: {{ include "kuberl.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: kuberl
{{- end }}

{{/* Labels of the operator's objects. */}}
{{- define "kuberl.labels" -}}
{{ include "kuberl.baseLabels" . }}
app.kubernetes.io/component: operator
{{- end }}

{{/* The operator pod's identity (Deployment selector, Service selector). */}}
{{- define "kuberl.selectorLabels" -}}
app.kubernetes.io/name: {{ include "kuberl.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end }}

{{- define "kuberl.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "kuberl.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* repository@digest when a digest is given (also a digest passed as the tag), else repository:tag. */}}
{{- define "kuberl.operatorImage" -}}
{{- $image := .Values.operator.image }}
{{- $tag := default .Chart.AppVersion $image.tag | toString }}
{{- if $image.digest }}
{{- printf "%s@%s" $image.repository $image.digest }}
{{- else if hasPrefix "sha256:" $tag }}
{{- printf "%s@%s" $image.repository $tag }}
{{- else }}
{{- printf "%s:%s" $image.repository $tag }}
{{- end }}
{{- end }}

{{/* Namespace of a monitoring object: its own value, else the release namespace. */}}
{{- define "kuberl.monitoringNamespace" -}}
{{- default .root.Release.Namespace .namespace }}
{{- end }}

{{/* true when the operator watches every namespace (watchNamespaces empty). */}}
{{- define "kuberl.clusterWide" -}}
{{- if not .Values.watchNamespaces }}true{{- end }}
{{- end }}

{{/* Namespaces that get the trainer's ServiceAccount and Role, one per line. */}}
{{- define "kuberl.trainerNamespaces" -}}
{{- $ns := .Values.trainer.namespaces | default .Values.watchNamespaces | default (list .Release.Namespace) }}
{{- range $ns | uniq }}
{{ . }}
{{- end }}
{{- end }}

{{/* RBAC rules of the operator for namespaced resources (shared by the ClusterRole and the per-namespace Roles). */}}
{{- define "kuberl.operatorRules" -}}
# watch RLJobs; patch = kopf's bookkeeping annotations
- apiGroups: ["kuberl.io"]
  resources: ["rljobs"]
  verbs: ["get", "list", "watch", "patch"]
# phase, conditions, restarts, ...
- apiGroups: ["kuberl.io"]
  resources: ["rljobs/status"]
  verbs: ["get", "patch"]
# children carry ownerReferences with blockOwnerDeletion: true, which OwnerReferencesPermissionEnforcement checks
- apiGroups: ["kuberl.io"]
  resources: ["rljobs/finalizers"]
  verbs: ["update"]
# create the RayJob, watch the labelled ones, toggle suspend / update the template; delete it when the operator
# ends the job (a permanent failure, a stall deadline) so that KubeRay does not retry it
- apiGroups: ["ray.io"]
  resources: ["rayjobs"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
# the RayCluster KubeRay builds from the RayJob: its rollout worker group is resized while the job runs
- apiGroups: ["ray.io"]
  resources: ["rayclusters"]
  verbs: ["get", "patch"]
# the spec ConfigMap <name>-spec
- apiGroups: [""]
  resources: ["configmaps"]
  verbs: ["get", "create", "patch"]
# the NetworkPolicy <name>-ray around the job's Ray pods
- apiGroups: ["networking.k8s.io"]
  resources: ["networkpolicies"]
  verbs: ["get", "create"]
# the sandbox pools <name>-sandbox-<pool>: a Deployment (scaled to 0 while suspended or finished, its readiness
# watched into status.sandboxes) and a Service each (their NetworkPolicies: the rule above)
- apiGroups: ["apps"]
  resources: ["deployments"]
  verbs: ["get", "list", "watch", "create", "patch"]
- apiGroups: [""]
  resources: ["services"]
  verbs: ["get", "create"]
# the checkpoint claim <name>-checkpoints of storage.claim
- apiGroups: [""]
  resources: ["persistentvolumeclaims"]
  verbs: ["get", "create"]
# Events on RLJobs; read: the Warning Events on Ray clusters and pods (why a cluster is not running)
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create", "get", "list", "watch"]
# why a Ray cluster is not running: its pods' scheduling and container states, read only
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["get", "list", "watch"]
{{- end }}
