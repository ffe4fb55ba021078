{{/*
What both webhook configurations share (kustomize base: mutatingwebhookconfiguration.yaml,
validatingwebhookconfiguration.yaml; https://kubernetes.io/docs/reference/access-authn-authz/extensible-admission-controllers/).
Call with (dict "ctx" $ "path" "/mutate").
*/}}
{{- define "gpu-admission.webhook.clientConfig" -}}
clientConfig:
  # caBundle is filled in by `gpu-admission install-certs` (or cert-manager's cainjector).
  service:
    name: {{ include "gpu-admission.fullname" .ctx }}
    namespace: {{ .ctx.Release.Namespace }}
    path: {{ .path }}
    port: 443
{{- end -}}

{{- define "gpu-admission.webhook.common" -}}
{{- $v := .Values.webhook -}}
admissionReviewVersions: [v1]
sideEffects: None
# Fail closed by default: a pod the webhook could not check is not admitted. Safe because the
# namespaceSelector limits the blast radius to opted-in namespaces, never kube-system or our
# own namespace, and matchConditions limit it to GPU pods and to pod creations the GPU-access
# guard may change or deny.
failurePolicy: {{ $v.failurePolicy }}
# Decisions are pure in-memory work (milliseconds); 5 s instead of the 10 s default keeps a
# hung replica from stalling `kubectl apply` and controllers for long.
timeoutSeconds: {{ $v.timeoutSeconds }}
matchPolicy: Equivalent
namespaceSelector:
  matchExpressions:
    - key: {{ $v.namespaceOptInLabel.key }}
      operator: In
      values: [{{ $v.namespaceOptInLabel.value | quote }}]
    # Even if someone labels them: never the control plane, never ourselves.
    - key: kubernetes.io/metadata.name
      operator: NotIn
      values: {{ include "gpu-admission.excludedNamespaces" . }}
{{- end -}}

{{/*
The pod webhooks' matchConditions (kustomize: base/*webhookconfiguration.yaml, and the
component webhook-guard-fallback). Expressions: gpu_admission.compile.guard.gpu_or_dra_pod and
webhook_fallback_condition (a test holds both installs to them).
*/}}
{{- define "gpu-admission.webhook.podMatchConditions" -}}
{{- if eq (include "gpu-admission.guard.inApiServer" .) "true" -}}
# Pods sent to the webhook: those naming a GPU resource (nvidia.com/gpu, nvidia.com/gpu.shared,
# nvidia.com/mig-*) or a DRA one (spec.resourceClaims, deviceclass.resource.kubernetes.io/*),
# whatever the quantity. Every other pod meets the GPU-access guard inside the API server
# (templates/guard-policies.yaml), whose matchConditions are this expression negated: a
# webhook outage refuses only GPU and DRA pods (docs/guard.md).
matchConditions:
  - name: gpu-or-dra-pod
    expression: |
      has(object.spec) && (
        (has(object.spec.resourceClaims) && size(object.spec.resourceClaims) > 0) ||
        (has(object.metadata.annotations) && ('gpu-fraction' in object.metadata.annotations || 'gpu-memory' in object.metadata.annotations)) ||
        (has(object.spec.containers) && object.spec.containers.exists(c, has(c.resources) && (
            (has(c.resources.limits) && c.resources.limits.exists(r, (r.startsWith('nvidia.com/') ? (r in ['nvidia.com/gpu', 'nvidia.com/gpu.shared', 'nvidia.com/gpucores', 'nvidia.com/gpumem', 'nvidia.com/gpumem-percentage'] || r.startsWith('nvidia.com/mig-')) : (r.startsWith('deviceclass.resource.kubernetes.io/') || r == 'gpu-admission.io/gpu-memory')))) ||
            (has(c.resources.requests) && c.resources.requests.exists(r, (r.startsWith('nvidia.com/') ? (r in ['nvidia.com/gpu', 'nvidia.com/gpu.shared', 'nvidia.com/gpucores', 'nvidia.com/gpumem', 'nvidia.com/gpumem-percentage'] || r.startsWith('nvidia.com/mig-')) : (r.startsWith('deviceclass.resource.kubernetes.io/') || r == 'gpu-admission.io/gpu-memory'))))))) ||
        (has(object.spec.initContainers) && object.spec.initContainers.exists(c, has(c.resources) && (
            (has(c.resources.limits) && c.resources.limits.exists(r, (r.startsWith('nvidia.com/') ? (r in ['nvidia.com/gpu', 'nvidia.com/gpu.shared', 'nvidia.com/gpucores', 'nvidia.com/gpumem', 'nvidia.com/gpumem-percentage'] || r.startsWith('nvidia.com/mig-')) : (r.startsWith('deviceclass.resource.kubernetes.io/') || r == 'gpu-admission.io/gpu-memory')))) ||
            (has(c.resources.requests) && c.resources.requests.exists(r, (r.startsWith('nvidia.com/') ? (r in ['nvidia.com/gpu', 'nvidia.com/gpu.shared', 'nvidia.com/gpucores', 'nvidia.com/gpumem', 'nvidia.com/gpumem-percentage'] || r.startsWith('nvidia.com/mig-')) : (r.startsWith('deviceclass.resource.kubernetes.io/') || r == 'gpu-admission.io/gpu-memory'))))))))
{{- else -}}
# Pods sent to the webhook: GPU and DRA pods, and every pod creation or kubectl-debug
# ephemeral container the GPU-access guard may change or deny (the API server serves no
# MutatingAdmissionPolicy v1, or webhook.guard is "webhook"): skipped are only pods whose
# every container already sets NVIDIA_VISIBLE_DEVICES to "void" or "none" (every entry of that
# name, literal value) and that have no hostPath volume (docs/guard.md).
matchConditions:
  - name: gpu-or-dra-pod-or-guarded
    expression: |-
      (has(object.spec) && (
        (has(object.spec.resourceClaims) && size(object.spec.resourceClaims) > 0) ||
        (has(object.metadata.annotations) && ('gpu-fraction' in object.metadata.annotations || 'gpu-memory' in object.metadata.annotations)) ||
        (has(object.spec.containers) && object.spec.containers.exists(c, has(c.resources) && (
            (has(c.resources.limits) && c.resources.limits.exists(r, (r.startsWith('nvidia.com/') ? (r in ['nvidia.com/gpu', 'nvidia.com/gpu.shared', 'nvidia.com/gpucores', 'nvidia.com/gpumem', 'nvidia.com/gpumem-percentage'] || r.startsWith('nvidia.com/mig-')) : (r.startsWith('deviceclass.resource.kubernetes.io/') || r == 'gpu-admission.io/gpu-memory')))) ||
            (has(c.resources.requests) && c.resources.requests.exists(r, (r.startsWith('nvidia.com/') ? (r in ['nvidia.com/gpu', 'nvidia.com/gpu.shared', 'nvidia.com/gpucores', 'nvidia.com/gpumem', 'nvidia.com/gpumem-percentage'] || r.startsWith('nvidia.com/mig-')) : (r.startsWith('deviceclass.resource.kubernetes.io/') || r == 'gpu-admission.io/gpu-memory'))))))) ||
        (has(object.spec.initContainers) && object.spec.initContainers.exists(c, has(c.resources) && (
            (has(c.resources.limits) && c.resources.limits.exists(r, (r.startsWith('nvidia.com/') ? (r in ['nvidia.com/gpu', 'nvidia.com/gpu.shared', 'nvidia.com/gpucores', 'nvidia.com/gpumem', 'nvidia.com/gpumem-percentage'] || r.startsWith('nvidia.com/mig-')) : (r.startsWith('deviceclass.resource.kubernetes.io/') || r == 'gpu-admission.io/gpu-memory')))) ||
            (has(c.resources.requests) && c.resources.requests.exists(r, (r.startsWith('nvidia.com/') ? (r in ['nvidia.com/gpu', 'nvidia.com/gpu.shared', 'nvidia.com/gpucores', 'nvidia.com/gpumem', 'nvidia.com/gpumem-percentage'] || r.startsWith('nvidia.com/mig-')) : (r.startsWith('deviceclass.resource.kubernetes.io/') || r == 'gpu-admission.io/gpu-memory'))))))))) ||
      (has(object.spec) && request.operation == 'CREATE' && (
          (has(object.spec.volumes) && object.spec.volumes.exists(v, has(v.hostPath))) ||
          (has(object.spec.containers) && object.spec.containers.exists(c,
            !(has(c.env) && c.env.exists(e, has(e.name) && e.name == 'NVIDIA_VISIBLE_DEVICES') && c.env.all(e,
              !has(e.name) || e.name != 'NVIDIA_VISIBLE_DEVICES' || (has(e.value) && !has(e.valueFrom) && (e.value == 'void' || e.value == 'none')))))) ||
          (has(object.spec.initContainers) && object.spec.initContainers.exists(c,
            !(has(c.env) && c.env.exists(e, has(e.name) && e.name == 'NVIDIA_VISIBLE_DEVICES') && c.env.all(e,
              !has(e.name) || e.name != 'NVIDIA_VISIBLE_DEVICES' || (has(e.value) && !has(e.valueFrom) && (e.value == 'void' || e.value == 'none')))))) ||
          ((has(object.spec.schedulerName) ? object.spec.schedulerName : '') in ['', 'default-scheduler'] &&
            !(has(object.spec.nodeName) && object.spec.nodeName != '') &&
            !(has(object.metadata.ownerReferences) && object.metadata.ownerReferences.exists(r, has(r.kind) && r.kind == 'DaemonSet'))))) ||
      (has(object.spec) && has(request.subResource) && request.subResource == 'ephemeralcontainers' && has(object.spec.ephemeralContainers) &&
        object.spec.ephemeralContainers.exists(c,
            !(has(c.env) && c.env.exists(e, has(e.name) && e.name == 'NVIDIA_VISIBLE_DEVICES') && c.env.all(e,
              !has(e.name) || e.name != 'NVIDIA_VISIBLE_DEVICES' || (has(e.value) && !has(e.valueFrom) && (e.value == 'void' || e.value == 'none'))))))
{{- end -}}
{{- end -}}
