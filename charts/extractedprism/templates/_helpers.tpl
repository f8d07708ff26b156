{{/* The chart's name, or nameOverride. */}}
{{- define "extractedprism.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/*
The release's full name: fullnameOverride, else the release name with the
chart's name appended unless the release name already contains it.
Kubernetes names stop at 63 characters.
*/}}
{{- define "extractedprism.fullname" -}}
{{- $name := include "extractedprism.name" . -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{/* The namespace of the release's objects: namespaceOverride, else the release's. */}}
{{- define "extractedprism.namespace" -}}
{{- default .Release.Namespace .Values.namespaceOverride -}}
{{- end -}}

{{/* Labels that select the pods; they must not change between upgrades. */}}
{{- define "extractedprism.selectorLabels" -}}
app.kubernetes.io/name: {{ include "extractedprism.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/* Labels on every object: the chart's, then commonLabels. */}}
{{- define "extractedprism.labels" -}}
{{ include "extractedprism.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
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
token and CA, and the readyz check may read either; a sidecar may need it
too (serviceAccount.automountServiceAccountToken). Without such a need the
token stays out of the pod.
*/}}
{{- define "extractedprism.automountToken" -}}
{{- $dir := include "extractedprism.serviceAccountDir" . -}}
{{- $readyz := eq .Values.healthCheck "readyz" -}}
{{- $tokenForReadyz := and $readyz (eq .Values.readyz.credentials "serviceAccountToken") (hasPrefix $dir .Values.readyz.serviceAccountToken.path) -}}
{{- $caForReadyz := and $readyz (hasPrefix $dir .Values.readyz.caFile) -}}
{{- $own := dig "automountServiceAccountToken" false .Values.serviceAccount -}}
{{- or .Values.discovery.enabled $tokenForReadyz $caForReadyz $own -}}
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

{{/*
The daemon's image, for the DaemonSet and the check hook alike:
global.imageRegistry or image.registry before the repository, and the
digest, when set, instead of the tag, so that what runs is exactly what was
verified.
*/}}
{{- define "extractedprism.image" -}}
{{- $registry := dig "imageRegistry" "" (.Values.global | default dict) | default .Values.image.registry -}}
{{- $repository := .Values.image.repository -}}
{{- if $registry -}}
{{- $repository = printf "%s/%s" $registry $repository -}}
{{- end -}}
{{- if .Values.image.digest -}}
{{ $repository }}@{{ .Values.image.digest }}
{{- else -}}
{{ $repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}
{{- end -}}

{{/*
The image pull secrets of the DaemonSet and the check Job, as a YAML list:
global.imagePullSecrets, which a parent chart hands every subchart, then
the chart's own, each name once. An entry is {name: <Secret>} or, as some
parent charts write the global one, the bare name.
*/}}
{{- define "extractedprism.imagePullSecrets" -}}
{{- $global := dig "imagePullSecrets" (list) (.Values.global | default dict) -}}
{{- $names := list -}}
{{- range concat $global (.Values.imagePullSecrets | default list) -}}
{{- $name := . -}}
{{- if kindIs "map" . }}{{ $name = .name }}{{ end -}}
{{- $names = append $names $name -}}
{{- end -}}
{{- $secrets := list -}}
{{- range $names | uniq }}{{ $secrets = append $secrets (dict "name" .) }}{{ end -}}
{{- with $secrets }}{{ toYaml . }}{{ end -}}
{{- end -}}

{{/*
A security context: the chart's (base, a dict) with the user's values
(over) merged on top, the user winning.
*/}}
{{- define "extractedprism.securityContext" -}}
{{- toYaml (mergeOverwrite .base (deepCopy (.over | default dict))) -}}
{{- end -}}

{{/*
The daemon's own UID and GID, 7445 after its port. Not 65534 (nobody),
which node exporters and many other pods run as: any process of the
daemon's UID can take its listening sockets through the hand-over socket,
and write its endpoint cache. 7445 is no distribution's system account
(below 1000), no common image's user (1000, 1001, 65532, 65534), and a
login account only on a node with over 6,000 of them.
*/}}
{{- define "extractedprism.uid" -}}7445{{- end -}}

{{/*
The pod's security context for a UID: the daemon's own, or 0 where the
kubelet's key must be read.
*/}}
{{- define "extractedprism.podSecurityContext" -}}
{{- $base := dict "runAsUser" .uid "runAsGroup" .uid "runAsNonRoot" (ne .uid 0) "seccompProfile" (dict "type" "RuntimeDefault") -}}
{{- include "extractedprism.securityContext" (dict "base" $base "over" .values.podSecurityContext) -}}
{{- end -}}

{{/* The container's security context for a UID. */}}
{{- define "extractedprism.containerSecurityContext" -}}
{{- $base := dict "runAsUser" .uid "runAsGroup" .uid "runAsNonRoot" (ne .uid 0)
  "privileged" false "allowPrivilegeEscalation" false "readOnlyRootFilesystem" true
  "capabilities" (dict "drop" (list "ALL")) "seccompProfile" (dict "type" "RuntimeDefault") -}}
{{- include "extractedprism.securityContext" (dict "base" $base "over" .values.securityContext) -}}
{{- end -}}

{{/*
A probe: the values as they are when they name a handler of their own,
else the chart's HTTP GET of path on the health port with the values'
timing.
*/}}
{{- define "extractedprism.probe" -}}
{{- $probe := .probe | default dict -}}
{{- $own := or $probe.httpGet $probe.tcpSocket $probe.exec $probe.grpc -}}
{{- if not $own -}}
{{- $get := dict "path" .path "port" .port -}}
{{- with .host }}{{ $_ := set $get "host" . }}{{ end -}}
{{- $probe = merge (dict "httpGet" $get) $probe -}}
{{- end -}}
{{- toYaml $probe -}}
{{- end -}}

{{/* The directory the readyz client certificate Secret is mounted at. */}}
{{- define "extractedprism.clientCertDir" -}}
/etc/extractedprism/readyz-client
{{- end -}}

{{/* The directory the endpoint cache file lives in, inside the container. */}}
{{- define "extractedprism.cacheDir" -}}
/var/lib/extractedprism
{{- end -}}

{{/*
The daemon's configuration, as the env of a container: the DaemonSet's
and the check hook's, which must read the same values for the check to
mean anything. Every value is passed as written; the daemon alone judges
it (extractedprism check, run by the hook). extraEnv comes last.
*/}}
{{- define "extractedprism.env" -}}
{{- $readyz := eq .Values.healthCheck "readyz" -}}
{{- $credentials := .Values.readyz.credentials -}}
{{- $clientCertDir := include "extractedprism.clientCertDir" . -}}
- name: EP_ENDPOINTS
  value: {{ join "," .Values.endpoints | quote }}
- name: EP_BIND_ADDRESS
  value: {{ .Values.bindAddress | quote }}
- name: EP_BIND_PORT
  value: {{ .Values.bindPort | quote }}
{{- if .Values.metrics.expose }}
- name: EP_HEALTH_BIND_ADDRESS
  valueFrom:
    fieldRef:
      fieldPath: status.hostIP
{{- else if .Values.healthBindAddress }}
- name: EP_HEALTH_BIND_ADDRESS
  value: {{ .Values.healthBindAddress | quote }}
{{- end }}
- name: EP_HEALTH_PORT
  value: {{ .Values.healthPort | quote }}
- name: EP_HEALTH_INTERVAL
  value: {{ .Values.healthInterval | quote }}
- name: EP_HEALTH_TIMEOUT
  value: {{ .Values.healthTimeout | quote }}
- name: EP_ENABLE_DISCOVERY
  value: {{ .Values.discovery.enabled | quote }}
{{- if .Values.discovery.cache.enabled }}
- name: EP_ENDPOINT_CACHE_FILE
  value: {{ printf "%s/endpoints.json" (include "extractedprism.cacheDir" .) | quote }}
{{- end }}
{{- with .Values.kubeconfig }}
- name: EP_KUBECONFIG
  value: {{ . | quote }}
{{- end }}
- name: EP_LOG_LEVEL
  value: {{ .Values.logLevel | quote }}
- name: EP_LIVENESS_INTERVAL
  value: {{ .Values.livenessInterval | quote }}
- name: EP_LIVENESS_THRESHOLD
  value: {{ .Values.livenessThreshold | quote }}
- name: EP_DRAIN_TIMEOUT
  value: {{ .Values.drainTimeout | quote }}
- name: EP_REBALANCE_PERIOD
  value: {{ .Values.rebalancePeriod | quote }}
- name: EP_UPSTREAM_SELECTION
  value: {{ .Values.upstreamSelection | quote }}
- name: EP_HEALTH_CHECK
  value: {{ .Values.healthCheck | quote }}
{{- if $readyz }}
- name: EP_HEALTH_CHECK_CA_FILE
  value: {{ .Values.readyz.caFile | quote }}
- name: EP_HEALTH_CHECK_SERVER_NAME
  value: {{ .Values.readyz.serverName | quote }}
{{- if eq $credentials "kubeletCertificate" }}
# One file holds both the certificate and the key.
- name: EP_HEALTH_CHECK_CERT_FILE
  value: {{ .Values.readyz.kubeletCertificate.path | quote }}
- name: EP_HEALTH_CHECK_KEY_FILE
  value: {{ .Values.readyz.kubeletCertificate.path | quote }}
{{- else if eq $credentials "clientCertificate" }}
- name: EP_HEALTH_CHECK_CERT_FILE
  value: {{ printf "%s/tls.crt" $clientCertDir | quote }}
- name: EP_HEALTH_CHECK_KEY_FILE
  value: {{ printf "%s/tls.key" $clientCertDir | quote }}
{{- else if eq $credentials "serviceAccountToken" }}
- name: EP_HEALTH_CHECK_TOKEN_FILE
  value: {{ .Values.readyz.serviceAccountToken.path | quote }}
{{- end }}
{{- end }}
{{- if .Values.handover.enabled }}
- name: EP_HANDOVER_SOCKET
  value: {{ include "extractedprism.handoverSocket" . | quote }}
{{- end }}
{{- with .Values.extraEnv }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/*
The hand-over socket, in handover.hostPath, named after the release so
that releases sharing the directory do not take each other's sockets,
which are on other ports (the daemon refuses them).
*/}}
{{- define "extractedprism.handoverSocket" -}}
{{ .Values.handover.hostPath }}/{{ include "extractedprism.fullname" . }}.sock
{{- end -}}

{{/*
"true" when rollouts surge: a new pod starts beside the old one and
takes over its sockets.
*/}}
{{- define "extractedprism.surge" -}}
{{- if and .Values.handover.enabled .Values.handover.surge }}true{{ else }}false{{ end -}}
{{- end -}}

{{/*
The job label of the scraped series, which the PrometheusRule selects:
the value of the pods' label metrics.podMonitor.jobLabel names, else
"extractedprism", which the PodMonitor sets whatever the release is
called (and deploy/prometheus/scrape-node-level.yaml for node-level
instances).
*/}}
{{- define "extractedprism.job" -}}
{{- with .Values.metrics.podMonitor.jobLabel -}}
{{- $pod := merge (dict) ($.Values.podLabels | default dict) ($.Values.commonLabels | default dict) (include "extractedprism.selectorLabels" $ | fromYaml) -}}
{{- $job := index $pod . | default "" | toString -}}
{{- if not $job -}}
{{- fail (printf "metrics.podMonitor.jobLabel %q is no label of the pods, so the job would be the operator's <namespace>/<PodMonitor name>: name one of the pods' labels (podLabels), or leave it empty for job=\"extractedprism\"" .) -}}
{{- end -}}
{{- $job -}}
{{- else -}}
extractedprism
{{- end -}}
{{- end -}}

{{/*
The few rules about values only the chart reads, which the daemon never
sees; everything the daemon reads, it checks itself (the check hook).
Each failure says what to do.
*/}}
{{- define "extractedprism.validate" -}}
{{- if and .Values.metrics.expose .Values.healthBindAddress -}}
{{- fail "metrics.expose binds the health server to the node IP: leave healthBindAddress empty, or set metrics.expose=false" -}}
{{- end -}}
{{- if and .Values.discovery.nodeRBAC (not .Values.rbac.create) -}}
{{- fail "discovery.nodeRBAC creates a Role and RoleBinding, which rbac.create=false forbids: set rbac.create=true, or discovery.nodeRBAC=false and apply deploy/node-discovery-rbac.yaml yourself" -}}
{{- end -}}
{{- if and .Values.metrics.podMonitor.enabled (not .Values.metrics.expose) -}}
{{- fail "metrics.podMonitor.enabled needs metrics.expose=true: Prometheus cannot scrape a health server bound to loopback" -}}
{{- end -}}
{{- if and (eq .Values.healthCheck "readyz") (eq .Values.readyz.credentials "clientCertificate") (not (dig "clientCertificate" "secretName" "" .Values.readyz)) -}}
{{- fail "readyz.credentials=clientCertificate needs readyz.clientCertificate.secretName: the Secret of type kubernetes.io/tls that holds the certificate and key" -}}
{{- end -}}
{{- end -}}
