{{/*
Names. With the release name "gpu-admission" (the documented install command) every object has
exactly the name the kustomize base gives it; tests/chart/test_equivalence.py holds the two
installs to each other.
*/}}
{{- define "gpu-admission.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "gpu-admission.fullname" -}}
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

{{- define "gpu-admission.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Object names derived from the fullname (kustomize base: gpu-admission-<suffix>). */}}
{{- define "gpu-admission.policyConfigMap" -}}{{ include "gpu-admission.fullname" . }}-policy{{- end -}}
{{- define "gpu-admission.tlsSecret" -}}{{ include "gpu-admission.fullname" . }}-tls{{- end -}}
{{- define "gpu-admission.installCerts" -}}{{ include "gpu-admission.fullname" . }}-install-certs{{- end -}}

{{/*
Selector labels: exactly the base's (name + component), so Service, PDB, topology spread and
Deployment selectors match the kustomize install. Call with (dict "ctx" $ "component" "webhook").
*/}}
{{- define "gpu-admission.selectorLabels" -}}
app.kubernetes.io/name: {{ include "gpu-admission.name" .ctx }}
{{- with .component }}
app.kubernetes.io/component: {{ . }}
{{- end }}
{{- end -}}

{{/*
Object labels: the selector labels plus Helm's own (dropped by the equivalence test, nothing
else is). Pod templates carry only the selector labels, so a chart upgrade alone does not roll
the pods.
*/}}
{{- define "gpu-admission.labels" -}}
{{ include "gpu-admission.selectorLabels" . }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
app.kubernetes.io/managed-by: {{ .ctx.Release.Service }}
app.kubernetes.io/version: {{ .ctx.Chart.AppVersion | quote }}
helm.sh/chart: {{ include "gpu-admission.chart" .ctx }}
{{- end -}}

{{- define "gpu-admission.image" -}}
{{- $image := .image -}}
{{- printf "%s:%s" $image.repository (default .ctx.Chart.AppVersion ($image.tag | toString)) -}}
{{- end -}}

{{/*
Namespaces the webhooks are never called for (namespaceSelector NotIn): the control plane,
our own namespace (no deadlock on restart), and the extra exempt namespaces.
*/}}
{{- define "gpu-admission.excludedNamespaces" -}}
{{- toJson (concat (list "kube-system" .Release.Namespace) .Values.exemptions.namespaces | uniq) -}}
{{- end -}}

{{/*
The policy document mounted into the server: .Values.policy with the extra exemptions merged
into spec.exemptions (namespaces, users, groups; duplicates dropped). A policy that does not
list exemptions.namespaces gets the model's default ["kube-system"] before the extras are added
(gpu_admission/policy/model.py, Exemptions).
*/}}
{{- define "gpu-admission.policy" -}}
{{- $policy := deepCopy .Values.policy -}}
{{- $extra := .Values.exemptions -}}
{{- if or $extra.namespaces $extra.users $extra.groups -}}
{{- if not (hasKey $policy "spec") -}}{{- $_ := set $policy "spec" dict -}}{{- end -}}
{{- if not (hasKey $policy.spec "exemptions") -}}{{- $_ := set $policy.spec "exemptions" dict -}}{{- end -}}
{{- $ex := $policy.spec.exemptions -}}
{{- $namespaces := ternary $ex.namespaces (list "kube-system") (hasKey $ex "namespaces") -}}
{{- $_ := set $ex "namespaces" (concat $namespaces $extra.namespaces | uniq) -}}
{{- $_ := set $ex "users" (concat (default list $ex.users) $extra.users | uniq) -}}
{{- $_ := set $ex "groups" (concat (default list $ex.groups) $extra.groups | uniq) -}}
{{- end -}}
{{- toYaml $policy -}}
{{- end -}}

{{/*
The guard half (docs/compile.md, "The guard inside the API server"): "true" when the GPU-access
guard for pods without a GPU or DRA resource runs as compiled admission policies
(templates/guard-policies.yaml) and the webhooks see only GPU and DRA pods; "false" when the
webhook keeps the guard for every pod (API servers before 1.36, or webhook.guard: webhook).
*/}}
{{- define "gpu-admission.guard.inApiServer" -}}
{{- $mode := .Values.webhook.guard -}}
{{- if eq $mode "apiServer" -}}true
{{- else if eq $mode "webhook" -}}false
{{- else -}}{{ .Capabilities.APIVersions.Has "admissionregistration.k8s.io/v1/MutatingAdmissionPolicy" }}
{{- end -}}
{{- end -}}

{{/* The merged policy's exemptions (gpu-admission.policy), defaults as the model's. */}}
{{- define "gpu-admission.guard.exemptions" -}}
{{- $policy := include "gpu-admission.policy" . | fromYaml -}}
{{- $spec := default dict $policy.spec -}}
{{- $ex := default dict $spec.exemptions -}}
{{- $namespaces := ternary $ex.namespaces (list "kube-system") (hasKey $ex "namespaces") -}}
{{- toJson (dict "namespaces" (default list $namespaces) "users" (default list $ex.users) "groups" (default list $ex.groups)) -}}
{{- end -}}

{{/* The three guard rules' modes (policy spec.rules; the model's default is enforce). */}}
{{- define "gpu-admission.guard.modes" -}}
{{- $policy := include "gpu-admission.policy" . | fromYaml -}}
{{- $spec := default dict $policy.spec -}}
{{- $rules := default dict $spec.rules -}}
{{- $modes := dict -}}
{{- range $rule := list "gpu-access-isolation" "gpu-device-hostpath" "gpu-visible-devices" -}}
{{- $_ := set $modes $rule (default "enforce" (get $rules $rule)) -}}
{{- end -}}
{{- toJson $modes -}}
{{- end -}}

{{/* "true" when a guard rule is in mode .mode (dict "root" . "mode" "warn"): the guard's
enforce and warn policies exist only then (gpu_admission.compile.guard.compile_guard). */}}
{{- define "gpu-admission.guard.modeUsed" -}}
{{- $modes := include "gpu-admission.guard.modes" .root | fromJson -}}
{{- if has .mode (values $modes) }}true{{ end -}}
{{- end -}}

{{/* "true" when the policy exempts users or groups: the guard's not-exempt condition exists
only then (gpu_admission.compile.guard.compile_guard). */}}
{{- define "gpu-admission.guard.exempting" -}}
{{- $ex := include "gpu-admission.guard.exemptions" . | fromJson -}}
{{- if or $ex.users $ex.groups }}true{{ end -}}
{{- end -}}

{{- define "gpu-admission.guard.users" -}}
{{- $ex := include "gpu-admission.guard.exemptions" . | fromJson -}}
{{- toJson (default list $ex.users | uniq | sortAlpha) -}}
{{- end -}}

{{- define "gpu-admission.guard.groups" -}}
{{- $ex := include "gpu-admission.guard.exemptions" . | fromJson -}}
{{- toJson (default list $ex.groups | uniq | sortAlpha) -}}
{{- end -}}

{{/* Never matched: kube-system, the release namespace, the policy's exempt namespaces. */}}
{{- define "gpu-admission.guard.excludedNamespaces" -}}
{{- $ex := include "gpu-admission.guard.exemptions" . | fromJson -}}
{{- toJson (concat (list "kube-system" .Release.Namespace) (default list $ex.namespaces) | uniq | sortAlpha) -}}
{{- end -}}

{{/* The scheduler pods without a GPU get (policy spec.scheduling.cpuPods gpu-aware: the
policy's schedulerName; "" for none): gpu_admission.policy.model Compiled.cpu_scheduler. */}}
{{- define "gpu-admission.guard.cpuScheduler" -}}
{{- $policy := include "gpu-admission.policy" . | fromYaml -}}
{{- $spec := default dict $policy.spec -}}
{{- $name := ternary $spec.schedulerName "gpu-aware-scheduler" (hasKey $spec "schedulerName") -}}
{{- $scheduling := default dict $spec.scheduling -}}
{{- if and $name (eq (default "gpu-aware" $scheduling.cpuPods) "gpu-aware") -}}{{ $name }}{{- end -}}
{{- end -}}

{{/*
gpu_admission.compile.guard.guard_digest: sha256 (16 hex digits) of the canonical JSON of the
guard's inputs, as Go's encoding/json writes it (sorted keys, no spaces).
*/}}
{{- define "gpu-admission.guard.digest" -}}
{{- $inputs := dict "cpuScheduler" (include "gpu-admission.guard.cpuScheduler" .) "modes" (include "gpu-admission.guard.modes" . | fromJson) "excludedNamespaces" (include "gpu-admission.guard.excludedNamespaces" . | fromJsonArray) "users" (include "gpu-admission.guard.users" . | fromJsonArray) "groups" (include "gpu-admission.guard.groups" . | fromJsonArray) -}}
{{- printf "sha256:%s" (toJson $inputs | sha256sum | trunc 16) -}}
{{- end -}}
