{{/*
The base name of this release's objects: the release name if it already contains the chart
name (so `helm install polyrl` gives "polyrl-operator"), else "<release>-polyrl".
*/}}
{{- define "polyrl.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 54 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 54 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{/* Name of the operator Deployment and of its cluster-wide RBAC objects. */}}
{{- define "polyrl.operatorName" -}}
{{- printf "%s-operator" (include "polyrl.fullname" .) -}}
{{- end -}}

{{/* Name of the optional NATS StatefulSet and Service. */}}
{{- define "polyrl.natsName" -}}
{{- printf "%s-nats" .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* The NATS URL the operator gets: the chart's own server when it deploys one. */}}
{{- define "polyrl.natsUrl" -}}
{{- if .Values.nats.deploy -}}
{{- printf "nats://%s.%s.svc:4222" (include "polyrl.natsName" .) .Release.Namespace -}}
{{- else -}}
{{- required "nats.url is required (or set nats.deploy=true)" .Values.nats.url -}}
{{- end -}}
{{- end -}}

{{/* Labels of every object: the selector base plus the descriptive ones. */}}
{{- define "polyrl.labels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{ include "polyrl.commonLabels" . }}
{{- end -}}

{{/* The labels that never take part in a selector. */}}
{{- define "polyrl.commonLabels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: polyrl
{{- end -}}

{{- define "polyrl.operatorSelector" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end -}}

{{- define "polyrl.natsSelector" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: nats
{{- end -}}

{{/* Pod- and container-level settings that satisfy Pod Security "restricted". */}}
{{- define "polyrl.podSecurityContext" -}}
runAsNonRoot: true
runAsUser: 65532
runAsGroup: 65532
fsGroup: 65532
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{- define "polyrl.containerSecurityContext" -}}
runAsNonRoot: true
runAsUser: 65532
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
capabilities:
  drop: ["ALL"]
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{/*
How the jobs reach NATS: signed per-role users (the default, nats.signingSecret), or shared
credentials when nats.insecure opts in. Anything else fails the install, saying what to do.
*/}}
{{- define "polyrl.natsSecurity" -}}
{{- if and .Values.nats.deploy (not .Values.nats.insecure) -}}
{{- fail "nats.deploy runs a NATS server without authentication: set nats.insecure=true too (every pod can then read and write every job's data), or use a NATS server that includes the auth.conf of `polyrl nats-trust DIR`" -}}
{{- end -}}
{{- if and (not .Values.nats.signingSecret) (not .Values.nats.insecure) -}}
{{- fail "nats.signingSecret is empty: name the Secret from `polyrl nats-trust DIR` (kubectl apply -f DIR/signing-secret.yaml), or set nats.insecure=true to let every job's pods share NATS" -}}
{{- end -}}
{{- end -}}
