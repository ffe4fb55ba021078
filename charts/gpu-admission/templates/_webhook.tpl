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

{{/* The pod webhooks' matchConditions (kustomize base: identical in both files). */}}
{{- define "gpu-admission.webhook.podMatchConditions" -}}
# Pods sent to the webhook: those that request or limit a GPU resource (nvidia.com/gpu,
# nvidia.com/gpu.shared, nvidia.com/mig-*) in a container or init container, and on CREATE
# also every other pod the GPU-access guard may change or deny (docs/guard.md): skipped
# are only pods whose every container and init container already sets
# NVIDIA_VISIBLE_DEVICES to "void" or "none" (every entry of that name, literal value) and
# that have no hostPath volume. UPDATEs of non-GPU pods are skipped (the guard does not
# re-judge them: containers, env and volumes are immutable). Every field access is
# guarded with has(): with failurePolicy Fail a CEL evaluation error would reject the
# request. `object` is never null here (rules select CREATE/UPDATE only; it is null only
# for DELETE). Resources renamed with the device plugin's `rename:` are NOT matched.
# DRA GPU pods (docs/dra.md) are sent too: any pod with spec.resourceClaims, and limits or
# requests named deviceclass.resource.kubernetes.io/<class>. A DeviceClass's own
# extendedResourceName is only matched when it is nvidia.com/gpu (NVIDIA's chart's choice).
matchConditions:
  - name: gpu-pod-or-guarded-create
    expression: |
      has(object.spec) && (
        (has(object.spec.resourceClaims) && size(object.spec.resourceClaims) > 0) ||
        (has(object.spec.containers) && object.spec.containers.exists(c,
          has(c.resources) && (
            (has(c.resources.limits) && c.resources.limits.exists(r, r == 'nvidia.com/gpu' || r == 'nvidia.com/gpu.shared' || r.startsWith('nvidia.com/mig-') || r.startsWith('deviceclass.resource.kubernetes.io/'))) ||
            (has(c.resources.requests) && c.resources.requests.exists(r, r == 'nvidia.com/gpu' || r == 'nvidia.com/gpu.shared' || r.startsWith('nvidia.com/mig-') || r.startsWith('deviceclass.resource.kubernetes.io/')))))) ||
        (has(object.spec.initContainers) && object.spec.initContainers.exists(c,
          has(c.resources) && (
            (has(c.resources.limits) && c.resources.limits.exists(r, r == 'nvidia.com/gpu' || r == 'nvidia.com/gpu.shared' || r.startsWith('nvidia.com/mig-') || r.startsWith('deviceclass.resource.kubernetes.io/'))) ||
            (has(c.resources.requests) && c.resources.requests.exists(r, r == 'nvidia.com/gpu' || r == 'nvidia.com/gpu.shared' || r.startsWith('nvidia.com/mig-') || r.startsWith('deviceclass.resource.kubernetes.io/')))))) ||
        (request.operation == 'CREATE' && (
          (has(object.spec.volumes) && object.spec.volumes.exists(v, has(v.hostPath))) ||
          (has(object.spec.containers) && object.spec.containers.exists(c,
            !(has(c.env) && c.env.exists(e, has(e.name) && e.name == 'NVIDIA_VISIBLE_DEVICES') && c.env.all(e,
              !has(e.name) || e.name != 'NVIDIA_VISIBLE_DEVICES' || (has(e.value) && !has(e.valueFrom) && (e.value == 'void' || e.value == 'none')))))) ||
          (has(object.spec.initContainers) && object.spec.initContainers.exists(c,
            !(has(c.env) && c.env.exists(e, has(e.name) && e.name == 'NVIDIA_VISIBLE_DEVICES') && c.env.all(e,
              !has(e.name) || e.name != 'NVIDIA_VISIBLE_DEVICES' || (has(e.value) && !has(e.valueFrom) && (e.value == 'void' || e.value == 'none'))))))))
      )
{{- end -}}
