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
