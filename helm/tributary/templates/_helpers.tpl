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

{{/* mTLS: the Secret mounted by `role` (controller, agent or client: the helm test pod). */}}
{{- define "tributary.tlsSecret" -}}
{{- $ := index . 0 -}}
{{- $role := index . 1 -}}
{{- $t := $.Values.tls -}}
{{- if $t.certManager.enabled -}}
{{- printf "%s-%s-tls" (include "tributary.fullname" $) $role -}}
{{- else if and (eq $role "agent") $t.agentSecretName -}}
{{- $t.agentSecretName -}}
{{- else if and (eq $role "client") $t.clientSecretName -}}
{{- $t.clientSecretName -}}
{{- else -}}
{{- required "tls.enabled needs tls.secretName (a Secret with tls.crt, tls.key and ca.crt) or tls.certManager.enabled" $t.secretName -}}
{{- end -}}
{{- end -}}

{{/* mTLS: the --tls-* flags of a container, one per line; (list . "client") adds
     --tls-server-name for processes that dial the controller. */}}
{{- define "tributary.tlsArgs" -}}
{{- $ := index . 0 -}}
{{- $t := $.Values.tls -}}
{{- $dir := trimSuffix "/" $t.mountPath -}}
- --tls-cert
- {{ printf "%s/tls.crt" $dir | quote }}
- --tls-key
- {{ printf "%s/tls.key" $dir | quote }}
- --tls-ca
- {{ printf "%s/ca.crt" $dir | quote }}
- --tls-reload-seconds
- {{ $t.reloadSeconds | quote }}
{{- if and (eq (index . 1) "client") $t.serverName }}
- --tls-server-name
- {{ $t.serverName | quote }}
{{- end }}
{{- end -}}
