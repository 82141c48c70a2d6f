{{/* Chart name, truncated to the 63 characters of a DNS label. */}}
{{- define "tributary.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Prefix of every object name: the release, then the chart's name unless the release has it. */}}
{{- define "tributary.fullname" -}}
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

{{/* Labels of every object: name, instance and tributary.commonLabels. */}}
{{- define "tributary.labels" -}}
app.kubernetes.io/name: {{ include "tributary.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{ include "tributary.commonLabels" . }}
{{- end -}}

{{/* The labels beside the selector labels (pod templates add the selector labels). */}}
{{- define "tributary.commonLabels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* Selector labels of one component: include with (list $ "controller"). */}}
{{- define "tributary.selectorLabels" -}}
{{- $root := index . 0 -}}
app.kubernetes.io/name: {{ include "tributary.name" $root }}
app.kubernetes.io/instance: {{ $root.Release.Name }}
app.kubernetes.io/component: {{ index . 1 }}
{{- end -}}

{{- define "tributary.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "tributary.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* An image reference: include with (list $ "controller"). */}}
{{- define "tributary.image" -}}
{{- $root := index . 0 -}}
{{- $image := index $root.Values.image (index . 1) -}}
{{- $tag := default $root.Chart.AppVersion $image.tag -}}
{{- if $root.Values.image.registry -}}
{{- printf "%s/%s:%s" $root.Values.image.registry $image.repository $tag -}}
{{- else -}}
{{- printf "%s:%s" $image.repository $tag -}}
{{- end -}}
{{- end -}}

{{/* The controller's Service name and the address agents and the CLI dial. */}}
{{- define "tributary.controllerService" -}}
{{- printf "%s-controller" (include "tributary.fullname" .) -}}
{{- end -}}
{{- define "tributary.controllerAddress" -}}
{{- if .Values.agent.controllerAddress -}}
{{- .Values.agent.controllerAddress -}}
{{- else -}}
{{- printf "%s.%s.svc:%d" (include "tributary.controllerService" .) .Release.Namespace (int .Values.controller.grpcPort) -}}
{{- end -}}
{{- end -}}

{{/* The socket training processes dial, as the agent's --listen and TRIBUTARY_AGENT_ADDRESS. */}}
{{- define "tributary.agentSocket" -}}
{{- printf "unix:%s/agent.sock" (trimSuffix "/" .Values.agent.socketDir) -}}
{{- end -}}
