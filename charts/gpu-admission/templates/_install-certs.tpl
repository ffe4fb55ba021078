{{/*
The pod both the install-certs Job and CronJob run: create/rotate the TLS Secret and patch
caBundle into both webhook configurations. Idempotent: a run with nothing to do only reads.
*/}}
{{- define "gpu-admission.installCerts.pod" -}}
{{- $sm := .Values.certificates.selfManaged -}}
serviceAccountName: {{ include "gpu-admission.installCerts" . }}
restartPolicy: OnFailure
enableServiceLinks: false
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
securityContext:
  runAsNonRoot: true
  runAsUser: 65532
  runAsGroup: 65532
  seccompProfile:
    type: RuntimeDefault
containers:
  - name: install-certs
    image: {{ include "gpu-admission.image" (dict "ctx" $ "image" .Values.image) }}
    imagePullPolicy: {{ .Values.image.pullPolicy }}
    args:
      - install-certs
      - --namespace
      - {{ .Release.Namespace }}
      - --service
      - {{ include "gpu-admission.fullname" . }}
      - --secret
      - {{ include "gpu-admission.tlsSecret" . }}
      - --webhook-config
      - {{ include "gpu-admission.fullname" . }}
      - --days
      - {{ $sm.days | quote }}
      - --renew-before
      - {{ $sm.renewBefore | quote }}
    resources:
      {{- toYaml $sm.resources | nindent 6 }}
    securityContext:
      allowPrivilegeEscalation: false
      readOnlyRootFilesystem: true
      runAsNonRoot: true
      capabilities:
        drop: [ALL]
{{- end }}
