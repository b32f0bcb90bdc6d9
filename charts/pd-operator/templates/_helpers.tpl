{{/* Names: the chart name, overridable; the full name is release-scoped and fits a DNS label. */}}
{{- define "pd-operator.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "pd-operator.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else if contains (include "pd-operator.name" .) .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name (include "pd-operator.name" .) | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}

{{- define "pd-operator.selectorLabels" -}}
app.kubernetes.io/name: {{ include "pd-operator.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end }}

{{- define "pd-operator.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{ include "pd-operator.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: pd-operator
{{- end }}

{{- define "pd-operator.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "pd-operator.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "pd-operator.peeringName" -}}
{{- default (include "pd-operator.fullname" .) .Values.peering.name }}
{{- end }}

{{- define "pd-operator.image" -}}
{{- $tag := default .Chart.AppVersion .Values.image.tag }}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository $tag }}
{{- end }}
{{- end }}

{{/*
RBAC rules: exactly what the operator uses (team contract 5), split by scope.
Namespaced rules go into a ClusterRole (all namespaces) or one Role per watched namespace.
*/}}
{{- define "pd-operator.namespacedRules" -}}
- apiGroups: [pd.serving.dev]
  resources: [pddeployments]
  verbs: [get, list, watch, patch]
- apiGroups: [pd.serving.dev]
  resources: [pddeployments/status]
  verbs: [get, patch, update]
{{- /* Children carry blockOwnerDeletion: with OwnerReferencesPermissionEnforcement (OpenShift, hardened
clusters) setting it needs update on the owner's finalizers; without this every child create is refused. */}}
- apiGroups: [pd.serving.dev]
  resources: [pddeployments/finalizers]
  verbs: [update]
{{- /* spec.autoscaling writes replicas through the scale subresource, and yields to a HorizontalPodAutoscaler
that targets the same PDDeployment (one owner of replicas): it lists them, read-only. */}}
- apiGroups: [pd.serving.dev]
  resources: [pddeployments/scale]
  verbs: [get, patch]
- apiGroups: [autoscaling]
  resources: [horizontalpodautoscalers]
  verbs: [list]
- apiGroups: [""]
  resources: [pods]
  verbs: [get, list, watch, create, delete, patch]
- apiGroups: [""]
  resources: [services]
  verbs: [get, list, watch, create, patch, delete]
{{- /* Every applied child is read (get) before it is first applied: one held by another owner is never
taken over (ChildrenAdmitted NameConflict); a leftover is deleted only when it is the PDDeployment's. */}}
- apiGroups: [""]
  resources: [configmaps]
  verbs: [get, create, patch]
{{- /* The pod's credentials Secret (<name>-credentials): created once, with keys the operator draws, and
never applied, listed or deleted (its owner reference takes it along); read (get) for the admin key the
proxies' /status asks for. */}}
- apiGroups: [""]
  resources: [secrets]
  verbs: [get, create]
- apiGroups: [""]
  resources: [events]
  verbs: [create, patch]
- apiGroups: [events.k8s.io]
  resources: [events]
  verbs: [create, patch]
- apiGroups: [networking.k8s.io]
  resources: [networkpolicies]
  verbs: [get, list, watch, create, patch, delete]
- apiGroups: [batch]
  resources: [jobs]
  verbs: [get, list, watch, create, delete]
{{- /* PodDisruptionBudgets: the serving pods' and (more than one router pod) the router's, kept by
server-side apply; get and delete for the router's, gone when spec.router goes to one pod or off. */}}
- apiGroups: [policy]
  resources: [poddisruptionbudgets]
  verbs: [get, create, patch, delete]
{{- /* spec.router: its Deployment, Service and NetworkPolicy (above), ServiceAccount, Role and
RoleBinding, kept by server-side apply; when disabled, a Deployment found (get) is deleted with the
rest. RBAC's escalation rule lets the operator grant the router's Role only what it holds itself:
reading EndpointSlices, which it never does otherwise. */}}
- apiGroups: [apps]
  resources: [deployments]
  verbs: [get, create, patch, delete]
- apiGroups: [""]
  resources: [serviceaccounts]
  verbs: [get, create, patch, delete]
- apiGroups: [rbac.authorization.k8s.io]
  resources: [roles, rolebindings]
  verbs: [get, create, patch, delete]
- apiGroups: [discovery.k8s.io]
  resources: [endpointslices]
  verbs: [get, list, watch]
{{- /* spec.inferencePool: kept by server-side apply; when disabled, one found (get) is deleted. */}}
- apiGroups: [inference.networking.k8s.io]
  resources: [inferencepools]
  verbs: [get, create, patch, delete]
{{- if .Values.rbac.dynamicResourceAllocation }}
- apiGroups: [resource.k8s.io]
  resources: [resourceclaimtemplates]
  verbs: [get, list, watch, create, patch, delete]
- apiGroups: [resource.k8s.io]
  resources: [resourceclaims]
  verbs: [get]
{{- end }}
{{- end }}

{{/* What kopf needs cluster-wide in every mode: namespace and CRD discovery. */}}
{{- define "pd-operator.discoveryRules" -}}
- apiGroups: [""]
  resources: [namespaces]
  verbs: [list, watch]
{{- /* Nodes: read-only, through a watch (kopf index), to replace a serving pod whose node is lost. */}}
- apiGroups: [""]
  resources: [nodes]
  verbs: [list, watch]
- apiGroups: [apiextensions.k8s.io]
  resources: [customresourcedefinitions]
  verbs: [list, watch]
{{- end }}

{{- define "pd-operator.peeringRules" -}}
- apiGroups: [kopf.dev]
  resources: [{{ if .Values.watchNamespaces }}kopfpeerings{{ else }}clusterkopfpeerings{{ end }}]
  verbs: [get, list, watch, patch]
{{- end }}

{{/* `pdctl operator` arguments: scope, peering, probe and metrics ports, then the user's extras. */}}
{{- /* The operator's copy of the tenancy policy: the chart's policy values less the VAP switch. */}}
{{- define "pd-operator.policy" -}}
{{- toYaml (omit .Values.policy "admission") }}
{{- end }}

{{- /* The tenancy policy's hostPaths prefixes as a JSON list of strings: every one, or with writable
those with readOnly false (a missing readOnly is true, as in pd_operator.policy.HostPathPrefix). */}}
{{- define "pd-operator.hostPathPrefixes" -}}
{{- $out := list }}
{{- range .hostPaths }}
{{- if or (not $.writable) (and (hasKey . "readOnly") (not .readOnly)) }}
{{- $out = append $out .pathPrefix }}
{{- end }}
{{- end }}
{{- toJson $out }}
{{- end }}

{{- define "pd-operator.args" -}}
{{- if .Values.watchNamespaces }}
{{- range .Values.watchNamespaces }}
- --namespace={{ . }}
{{- end }}
{{- else }}
- --all-namespaces
{{- end }}
{{- if .Values.peering.enabled }}
- --peering={{ include "pd-operator.peeringName" . }}
{{- else }}
- --standalone
{{- end }}
- --liveness-port={{ .Values.liveness.port }}
{{- /* The goodput probe Jobs run `pdctl bench` from this (small) image, not the ROCm runtime image. */}}
- --probe-image={{ include "pd-operator.image" . }}
{{- /* The tenancy policy ConfigMap (policy.yaml), mounted by the Deployment. */}}
- --policy=/etc/pd-operator/policy/policy.yaml
{{- if .Values.metrics.enabled }}
- --metrics-port={{ .Values.metrics.port }}
{{- end }}
{{- range .Values.extraArgs }}
- {{ . | quote }}
{{- end }}
{{- end }}
