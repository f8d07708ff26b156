{{/*
The release's full name: the release name, with the chart name appended
unless the release name already contains it. Kubernetes names stop at 63
characters.
*/}}
{{- define "extractedprism.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{/* Labels that select the pods; they must not change between upgrades. */}}
{{- define "extractedprism.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/* Labels on every object. */}}
{{- define "extractedprism.labels" -}}
{{ include "extractedprism.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{- define "extractedprism.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "extractedprism.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- required "serviceAccount.name is required with serviceAccount.create=false: name the existing ServiceAccount the pods run as" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/*
The directory of the service-account volume the kubelet mounts when
automountServiceAccountToken is true.
*/}}
{{- define "extractedprism.serviceAccountDir" -}}
/var/run/secrets/kubernetes.io/serviceaccount/
{{- end -}}

{{/*
"true" when the pod needs the service-account volume: discovery reads its
token and CA, and the readyz check may read either. Without such a need
the token stays out of the pod.
*/}}
{{- define "extractedprism.automountToken" -}}
{{- $dir := include "extractedprism.serviceAccountDir" . -}}
{{- $readyz := eq .Values.healthCheck "readyz" -}}
{{- $tokenForReadyz := and $readyz (eq .Values.readyz.credentials "serviceAccountToken") (hasPrefix $dir .Values.readyz.serviceAccountToken.path) -}}
{{- $caForReadyz := and $readyz (hasPrefix $dir .Values.readyz.caFile) -}}
{{- or .Values.discovery.enabled $tokenForReadyz $caForReadyz -}}
{{- end -}}

{{/*
The host the kubelet's probes connect to. The kubelet runs in the host
network namespace, so it reaches a loopback listener; a wildcard listener
is probed on loopback; with metrics.expose the host is left out and the
probes go to the pod IP, which is the node IP under hostNetwork.
*/}}
{{- define "extractedprism.probeHost" -}}
{{- if not .Values.metrics.expose -}}
{{- include "extractedprism.localHost" (default .Values.bindAddress .Values.healthBindAddress) -}}
{{- end -}}
{{- end -}}

{{/*
The address a process on the node uses to reach a listener bound to the
given address: loopback for a wildcard, else the address itself.
*/}}
{{- define "extractedprism.localHost" -}}
{{- if eq . "0.0.0.0" -}}
127.0.0.1
{{- else if eq . "::" -}}
::1
{{- else -}}
{{- . -}}
{{- end -}}
{{- end -}}

{{/*
host:port from a list of the two, with an IPv6 host in brackets, as in a
URL.
*/}}
{{- define "extractedprism.hostPort" -}}
{{- $host := index . 0 | toString -}}
{{- if contains ":" $host -}}
[{{ $host }}]:{{ index . 1 }}
{{- else -}}
{{ $host }}:{{ index . 1 }}
{{- end -}}
{{- end -}}

{{/* The directory the endpoint cache file lives in, inside the container. */}}
{{- define "extractedprism.cacheDir" -}}
/var/lib/extractedprism
{{- end -}}

{{/* Cross-value rules the schema cannot express; each failure says what to do. */}}
{{- define "extractedprism.validate" -}}
{{- if not .Values.endpoints -}}
{{- fail "endpoints is required: list the API servers as host:port, for example --set 'endpoints={10.0.0.1:6443,10.0.0.2:6443,10.0.0.3:6443}'" -}}
{{- end -}}
{{- if and .Values.metrics.expose .Values.healthBindAddress -}}
{{- fail "metrics.expose binds the health server to the node IP: leave healthBindAddress empty, or set metrics.expose=false" -}}
{{- end -}}
{{- if and .Values.metrics.podMonitor.enabled (not .Values.metrics.expose) -}}
{{- fail "metrics.podMonitor.enabled needs metrics.expose=true: Prometheus cannot scrape a health server bound to loopback" -}}
{{- end -}}
{{- if and (ne .Values.healthCheck "readyz") (ne .Values.readyz.credentials "none") -}}
{{- fail (printf "readyz.credentials=%s is used only by the readyz check: set healthCheck=readyz, or readyz.credentials=none" .Values.readyz.credentials) -}}
{{- end -}}
{{- if and .Values.discovery.cache.enabled (not .Values.discovery.enabled) -}}
{{- fail "discovery.cache.enabled needs discovery.enabled=true: the daemon keeps and reads the endpoint cache only with discovery on" -}}
{{- end -}}
{{- /* int: values files give float64, --set gives int64, and eq refuses to compare the two */ -}}
{{- if eq (int .Values.bindPort) (int .Values.healthPort) -}}
{{- fail (printf "bindPort and healthPort must differ: both are %v" .Values.bindPort) -}}
{{- end -}}
{{- end -}}
