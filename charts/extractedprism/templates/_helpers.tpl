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

{{/* The directory the readyz client certificate Secret is mounted at. */}}
{{- define "extractedprism.clientCertDir" -}}
/etc/extractedprism/readyz-client
{{- end -}}

{{/* The directory the endpoint cache file lives in, inside the container. */}}
{{- define "extractedprism.cacheDir" -}}
/var/lib/extractedprism
{{- end -}}

{{/*
The pattern of an IP address, as the daemon's net/netip parses it: IPv4 in
dotted decimal without leading zeros, or IPv6 in any of the forms of RFC
3986 (section 3.2.2), with an optional %zone. Sprig's regexMatch is Go's
regexp, so it needs no lookahead. testdata/hosts.txt holds it to the
daemon's verdicts.
*/}}
{{- define "extractedprism.ipPattern" -}}
{{- $octet := `(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])` -}}
{{- $v4 := printf `(%s\.){3}%s` $octet $octet -}}
{{- $h := `[0-9A-Fa-f]{1,4}` -}}
{{- $ls32 := printf `(%s:%s|%s)` $h $h $v4 -}}
{{- $v6 := list
  (printf `(%s:){6}%s` $h $ls32)
  (printf `::(%s:){5}%s` $h $ls32)
  (printf `(%s)?::(%s:){4}%s` $h $h $ls32)
  (printf `((%s:){0,1}%s)?::(%s:){3}%s` $h $h $h $ls32)
  (printf `((%s:){0,2}%s)?::(%s:){2}%s` $h $h $h $ls32)
  (printf `((%s:){0,3}%s)?::%s:%s` $h $h $h $ls32)
  (printf `((%s:){0,4}%s)?::%s` $h $h $ls32)
  (printf `((%s:){0,5}%s)?::%s` $h $h $h)
  (printf `((%s:){0,6}%s)?::` $h $h)
-}}
{{- printf `^(%s|(%s)(%%.+)?)$` $v4 (join "|" $v6) -}}
{{- end -}}

{{/*
"true" when the string is a host the daemon accepts (its validHost): an IP
address, or an RFC 1123 hostname of at most 253 characters, labels of 1-63
letters, digits and inner hyphens, one trailing dot allowed, the last label
not all digits (so 10.0.0.256 is no hostname). Empty otherwise.
*/}}
{{- define "extractedprism.isHost" -}}
{{- $name := trimSuffix "." . -}}
{{- $label := `[0-9A-Za-z]([0-9A-Za-z-]{0,61}[0-9A-Za-z])?` -}}
{{- if regexMatch (include "extractedprism.ipPattern" "") . -}}
true
{{- else if and (le (len $name) 253) (regexMatch (printf `^(%s\.)*%s$` $label $label) $name) (not (regexMatch `(^|\.)[0-9]+$` $name)) -}}
true
{{- end -}}
{{- end -}}

{{/*
Why the daemon would refuse the endpoint given, empty if it would not:
host:port with a host isHost accepts and a port in 1-65535, an IPv6
address in brackets, and brackets for nothing else.
*/}}
{{- define "extractedprism.endpointProblem" -}}
{{- $host := regexReplaceAll `^\[(.*)\]$` (regexReplaceAll `:[0-9]+$` . "") "${1}" -}}
{{- $port := regexReplaceAll `^.*:` . "" -}}
{{- $problem := "" -}}
{{- if not (regexMatch `^(\[[^\[\]]*\]|[^\[\]:]+):[0-9]+$` .) -}}
{{- $problem = "want host:port, an IPv6 address in brackets as in [fd00::1]:6443" -}}
{{- else if and (hasPrefix "[" .) (not (contains ":" $host)) -}}
{{- $problem = "brackets are only for IPv6 addresses, as in [fd00::1]:6443" -}}
{{- else if not (include "extractedprism.isHost" $host) -}}
{{- $problem = printf "host %q is not an IP address or RFC 1123 hostname" $host -}}
{{- else if or (not (regexMatch `^0*[1-9][0-9]{0,4}$` $port)) (gt (atoi $port) 65535) -}}
{{- $problem = printf "port %s is not in 1-65535" $port -}}
{{- end -}}
{{- $problem -}}
{{- end -}}

{{/*
The duration given (a Go duration such as 1m30s, or a Prometheus one such
as 1d; the schema checks which) in milliseconds, as a float.
*/}}
{{- define "extractedprism.milliseconds" -}}
{{- $ms := dict "ns" 0.000001 "us" 0.001 "µs" 0.001 "ms" 1.0 "s" 1000.0 "m" 60000.0 "h" 3600000.0 "d" 86400000.0 "w" 604800000.0 "y" 31536000000.0 -}}
{{- $total := 0.0 -}}
{{- range regexFindAll `[0-9]+(\.[0-9]+)?(ns|us|µs|ms|s|m|h|d|w|y)` (toString .) -1 -}}
{{- $n := regexFind `^[0-9]+(\.[0-9]+)?` . -}}
{{- $total = addf $total (mulf (float64 $n) (get $ms (trimPrefix $n .))) -}}
{{- end -}}
{{- $total -}}
{{- end -}}

{{/*
The resource quantity given (128Mi, 64M, 134217728) in bytes, as a float;
empty for forms it does not read (an exponent, a milli suffix), which the
checks then leave to Kubernetes.
*/}}
{{- define "extractedprism.bytes" -}}
{{- if or (kindIs "float64" .) (kindIs "int64" .) (kindIs "int" .) -}}
{{- float64 . -}}
{{- else -}}
{{- $factor := dict "" 1.0 "k" 1e3 "M" 1e6 "G" 1e9 "T" 1e12 "P" 1e15 "E" 1e18 "Ki" 1024.0 "Mi" 1048576.0 "Gi" 1073741824.0 "Ti" 1099511627776.0 "Pi" 1125899906842624.0 "Ei" 1152921504606846976.0 -}}
{{- $n := regexFind `^[0-9]+(\.[0-9]+)?` (toString .) -}}
{{- $suffix := trimPrefix $n (toString .) -}}
{{- if and $n (hasKey $factor $suffix) -}}
{{- mulf (float64 $n) (get $factor $suffix) -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/*
The smallest memory limit the chart accepts: the daemon idles at about 23
MiB of the cgroup's memory (19 MiB of it the binary's pages) and bounds its
connections by a 24 MiB reserve and 32 KiB each, never fewer than 64; below
this a burst of connections gets the pod OOM-killed, which cuts the node off
the API.
*/}}
{{- define "extractedprism.minMemoryLimit" -}}64Mi{{- end -}}

{{/* Cross-value rules the schema cannot express; each failure says what to do. */}}
{{- define "extractedprism.validate" -}}
{{- if not .Values.endpoints -}}
{{- fail "endpoints is required: list the API servers as host:port, for example --set 'endpoints={10.0.0.1:6443,10.0.0.2:6443,10.0.0.3:6443}'" -}}
{{- end -}}
{{- $bad := list -}}
{{- range $e := .Values.endpoints -}}
{{- with include "extractedprism.endpointProblem" (toString $e) -}}
{{- $bad = append $bad (printf "%q: %s" (toString $e) .) -}}
{{- end -}}
{{- end -}}
{{- if $bad -}}
{{- fail (printf "endpoints: the daemon would refuse %s" (join "; " $bad)) -}}
{{- end -}}
{{- if not (include "extractedprism.isHost" .Values.bindAddress) -}}
{{- fail (printf "bindAddress %q is not an IP address or RFC 1123 hostname" .Values.bindAddress) -}}
{{- end -}}
{{- if and .Values.healthBindAddress (not (include "extractedprism.isHost" .Values.healthBindAddress)) -}}
{{- fail (printf "healthBindAddress %q is not an IP address or RFC 1123 hostname" .Values.healthBindAddress) -}}
{{- end -}}
{{- if eq .Values.healthCheck "readyz" -}}
{{- if not (include "extractedprism.isHost" .Values.readyz.serverName) -}}
{{- fail (printf "readyz.serverName %q is not an IP address or RFC 1123 hostname" .Values.readyz.serverName) -}}
{{- else if contains "%" .Values.readyz.serverName -}}
{{- fail (printf "readyz.serverName %q must not have an IPv6 zone: certificates know nothing of it" .Values.readyz.serverName) -}}
{{- end -}}
{{- end -}}
{{- /* The daemon's rules on durations (its validate), so that a value it refuses stops the render instead of crash-looping every pod. */ -}}
{{- range $name := list "healthInterval" "healthTimeout" "livenessInterval" "livenessThreshold" -}}
{{- if lt (float64 (include "extractedprism.milliseconds" (get $.Values $name))) 1000.0 -}}
{{- fail (printf "%s must be at least 1s: got %s" $name (get $.Values $name)) -}}
{{- end -}}
{{- end -}}
{{- if ge (float64 (include "extractedprism.milliseconds" .Values.healthTimeout)) (float64 (include "extractedprism.milliseconds" .Values.healthInterval)) -}}
{{- fail (printf "healthTimeout must be less than healthInterval: got %s >= %s" .Values.healthTimeout .Values.healthInterval) -}}
{{- end -}}
{{- if le (float64 (include "extractedprism.milliseconds" .Values.livenessThreshold)) (float64 (include "extractedprism.milliseconds" .Values.livenessInterval)) -}}
{{- fail (printf "livenessThreshold must be greater than livenessInterval: got %s <= %s" .Values.livenessThreshold .Values.livenessInterval) -}}
{{- end -}}
{{- with .Values.metrics.podMonitor -}}
{{- if and .enabled .scrapeTimeout (gt (float64 (include "extractedprism.milliseconds" .scrapeTimeout)) (float64 (include "extractedprism.milliseconds" .interval))) -}}
{{- fail (printf "metrics.podMonitor.scrapeTimeout must not exceed metrics.podMonitor.interval (Prometheus refuses the scrape config): got %s > %s" .scrapeTimeout .interval) -}}
{{- end -}}
{{- end -}}
{{- with (.Values.resources.limits | default dict).memory -}}
{{- $limit := include "extractedprism.bytes" . -}}
{{- $floor := include "extractedprism.bytes" (include "extractedprism.minMemoryLimit" $) -}}
{{- if and $limit (lt (float64 $limit) (float64 $floor)) -}}
{{- fail (printf "resources.limits.memory %v is below %s: the daemon idles at about 23 MiB and a burst of connections would get the pod OOM-killed, cutting the node off the API" . (include "extractedprism.minMemoryLimit" $)) -}}
{{- end -}}
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
{{- if and (eq .Values.healthCheck "readyz") (eq .Values.readyz.credentials "clientCertificate") (not .Values.readyz.clientCertificate.secretName) -}}
{{- fail "readyz.credentials=clientCertificate needs readyz.clientCertificate.secretName: the Secret of type kubernetes.io/tls that holds the certificate and key" -}}
{{- end -}}
{{- if and .Values.discovery.cache.enabled (not .Values.discovery.enabled) -}}
{{- fail "discovery.cache.enabled needs discovery.enabled=true: the daemon keeps and reads the endpoint cache only with discovery on" -}}
{{- end -}}
{{- /* int: values files give float64, --set gives int64, and eq refuses to compare the two */ -}}
{{- if eq (int .Values.bindPort) (int .Values.healthPort) -}}
{{- fail (printf "bindPort and healthPort must differ: both are %v" .Values.bindPort) -}}
{{- end -}}
{{- end -}}
