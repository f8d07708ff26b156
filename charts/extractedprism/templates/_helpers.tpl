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

{{/* The daemon's image, for the DaemonSet and the check hook alike. */}}
{{- define "extractedprism.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
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

{{/* The host of a host:port endpoint, without the brackets of an IPv6 address. */}}
{{- define "extractedprism.endpointHost" -}}
{{- regexReplaceAll `^\[(.*)\]$` (regexReplaceAll `:[0-9]+$` . "") "${1}" -}}
{{- end -}}

{{/*
Why the daemon would refuse the endpoint given, empty if it would not:
host:port with a host isHost accepts and a port in 1-65535, an IPv6
address in brackets, and brackets for nothing else.
*/}}
{{- define "extractedprism.endpointProblem" -}}
{{- $host := include "extractedprism.endpointHost" . -}}
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
The addresses a host stands for in the daemon's check that no endpoint is
its own listener, comma-separated: 127.0.0.1 and ::1 for localhost, the
address itself for an IP address (an IPv4-mapped one as IPv4, IPv6
loopback and unspecified addresses spelled ::1 and ::), nothing for a
hostname.
*/}}
{{- define "extractedprism.hostIPs" -}}
{{- $h := lower (toString .) -}}
{{- if eq (trimSuffix "." $h) "localhost" -}}
127.0.0.1,::1
{{- else if regexMatch (include "extractedprism.ipPattern" "") $h -}}
{{- $h = regexReplaceAll `^::ffff:([0-9.]+)$` $h "${1}" -}}
{{- if regexMatch `^[0:]*:0{0,3}1$` $h -}}
::1
{{- else if and (contains ":" $h) (regexMatch `^[0:]+$` $h) -}}
::
{{- else -}}
{{ $h }}
{{- end -}}
{{- end -}}
{{- end -}}

{{/*
"true" when a dial to the address ip (from hostIPs) reaches a listener on
listen, the ports being the same, as the daemon's reaches has it without
the node's own addresses, which only the daemon knows: the same address; an
unspecified one, which Linux dials on this host, against a loopback or
unspecified listener; a loopback one against an unspecified listener.
*/}}
{{- define "extractedprism.reaches" -}}
{{- $ip := index . 0 -}}
{{- $listen := index . 1 -}}
{{- $any := list "0.0.0.0" "::" -}}
{{- $ipLoop := or (hasPrefix "127." $ip) (eq $ip "::1") -}}
{{- $listenLoop := or (hasPrefix "127." $listen) (eq $listen "::1") -}}
{{- if or (eq $ip $listen) (and (has $ip $any) (or $listenLoop (has $listen $any))) (and (has $listen $any) $ipLoop) -}}
true
{{- end -}}
{{- end -}}

{{/*
The duration given in nanoseconds, as a float, computed as Go's
time.ParseDuration does: each number's whole part times its unit, plus its
fraction times the unit truncated to whole nanoseconds (1.0000000001s is
1s), a leading sign, and 0 for "0". It reads Go durations (1m30s, .5s,
500µs) and Prometheus ones (1d, 2w); the schema checks which a value must
be. A value absent or null counts as the default given (a list of the value
and the default), which is what the daemon uses for an empty variable.
*/}}
{{- define "extractedprism.nanoseconds" -}}
{{- $s := toString (index . 0 | default (index . 1)) -}}
{{- $unitNs := dict "ns" 1.0 "us" 1e3 "µs" 1e3 "μs" 1e3 "ms" 1e6 "s" 1e9 "m" 6e10 "h" 3.6e12 "d" 8.64e13 "w" 6.048e14 "y" 3.1536e16 -}}
{{- $total := 0.0 -}}
{{- range regexFindAll `([0-9]+\.?[0-9]*|\.[0-9]+)(ns|us|µs|μs|ms|s|m|h|d|w|y)` $s -1 -}}
{{- $num := regexFind `^[0-9]*\.?[0-9]*` . -}}
{{- $unit := get $unitNs (trimPrefix $num .) -}}
{{- $frac := regexReplaceAll `^[0-9]*\.?` $num "" -}}
{{- $total = addf $total (mulf (float64 (regexFind `^[0-9]*` $num | default "0")) $unit) -}}
{{- if $frac -}}
{{- $total = addf $total (floor (mulf (float64 $frac) (divf $unit (float64 (printf "1e%d" (len $frac)))))) -}}
{{- end -}}
{{- end -}}
{{- if hasPrefix "-" $s -}}
{{- $total = mulf $total -1.0 -}}
{{- end -}}
{{- $total -}}
{{- end -}}

{{/*
The longest duration Go holds, 2562047h47m16.854775807s, in nanoseconds,
less a margin for the float's rounding: a longer value fails to parse and
the daemon exits.
*/}}
{{- define "extractedprism.maxNanoseconds" -}}9.2233720368547e18{{- end -}}

{{/*
The resource quantity given (128Mi, 64M, 134217728, 129e6, 0.5Gi) in
bytes, as a float; empty for a form it does not read, which the checks
then leave to Kubernetes.
*/}}
{{- define "extractedprism.bytes" -}}
{{- $q := toString . -}}
{{- if or (kindIs "float64" .) (kindIs "int64" .) (kindIs "int" .) -}}
{{- float64 . -}}
{{- else if regexMatch `^([0-9]+(\.[0-9]*)?|\.[0-9]+)[eE][+-]?[0-9]+$` $q -}}
{{- float64 $q -}}
{{- else -}}
{{- $factor := dict "" 1.0 "m" 0.001 "k" 1e3 "M" 1e6 "G" 1e9 "T" 1e12 "P" 1e15 "E" 1e18 "Ki" 1024.0 "Mi" 1048576.0 "Gi" 1073741824.0 "Ti" 1099511627776.0 "Pi" 1125899906842624.0 "Ei" 1152921504606846976.0 -}}
{{- $n := regexFind `^([0-9]+(\.[0-9]*)?|\.[0-9]+)` $q -}}
{{- $suffix := trimPrefix $n $q -}}
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

{{/*
The daemon's configuration, as the env of a container: the DaemonSet's
and the check hook's, which must read the same values for the check to
mean anything. Every value is passed as written; the daemon alone judges
it (extractedprism check, run by the hook).
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
{{- end -}}

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
{{- $listens := compact (splitList "," (include "extractedprism.hostIPs" .Values.bindAddress)) -}}
{{- $own := list -}}
{{- range $e := .Values.endpoints -}}
{{- $e = toString $e -}}
{{- if eq (atoi (regexReplaceAll `^.*:` $e "")) (int $.Values.bindPort) -}}
{{- range $ip := compact (splitList "," (include "extractedprism.hostIPs" (include "extractedprism.endpointHost" $e))) -}}
{{- range $listen := $listens -}}
{{- if include "extractedprism.reaches" (list $ip $listen) -}}
{{- $own = append $own $e -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- if $own -}}
{{- fail (printf "endpoints %s name this proxy's own listener %s, which would make it its own upstream: the daemon refuses them" (join ", " (uniq $own)) (include "extractedprism.hostPort" (list .Values.bindAddress .Values.bindPort))) -}}
{{- end -}}
{{- /* The daemon's rules on durations (its validate), with its defaults for a value left out, so that a value it refuses stops the render instead of crash-looping every pod. */ -}}
{{- $defaults := dict "healthInterval" "20s" "healthTimeout" "15s" "livenessInterval" "5s" "livenessThreshold" "15s" "drainTimeout" "30s" -}}
{{- $ns := dict -}}
{{- $shown := dict -}}
{{- range $name, $default := $defaults -}}
{{- $_ := set $shown $name (get $.Values $name | default $default) -}}
{{- $v := include "extractedprism.nanoseconds" (list (get $.Values $name) $default) | float64 -}}
{{- if gt $v (float64 (include "extractedprism.maxNanoseconds" $)) -}}
{{- fail (printf "%s %s is longer than a Go duration holds (2562047h, 292 years)" $name (get $shown $name)) -}}
{{- end -}}
{{- $_ := set $ns $name $v -}}
{{- end -}}
{{- range $name := list "healthInterval" "healthTimeout" "livenessInterval" "livenessThreshold" -}}
{{- if lt (get $ns $name) 1e9 -}}
{{- fail (printf "%s must be at least 1s: got %s" $name (get $shown $name)) -}}
{{- end -}}
{{- end -}}
{{- if lt (get $ns "drainTimeout") 0.0 -}}
{{- fail (printf "drainTimeout must not be negative: got %s" (get $shown "drainTimeout")) -}}
{{- end -}}
{{- if ge (get $ns "healthTimeout") (get $ns "healthInterval") -}}
{{- fail (printf "healthTimeout must be less than healthInterval: got %s >= %s" (get $shown "healthTimeout") (get $shown "healthInterval")) -}}
{{- end -}}
{{- if le (get $ns "livenessThreshold") (get $ns "livenessInterval") -}}
{{- fail (printf "livenessThreshold must be greater than livenessInterval: got %s <= %s" (get $shown "livenessThreshold") (get $shown "livenessInterval")) -}}
{{- end -}}
{{- with .Values.metrics.podMonitor -}}
{{- if and .enabled .scrapeTimeout (gt (include "extractedprism.nanoseconds" (list .scrapeTimeout "") | float64) (include "extractedprism.nanoseconds" (list .interval "") | float64)) -}}
{{- fail (printf "metrics.podMonitor.scrapeTimeout must not exceed metrics.podMonitor.interval (Prometheus refuses the scrape config): got %s > %s" .scrapeTimeout .interval) -}}
{{- end -}}
{{- end -}}
{{- with ((.Values.resources | default dict).limits | default dict).memory -}}
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
{{- if and (eq .Values.healthCheck "readyz") (eq .Values.readyz.credentials "clientCertificate") (not (dig "clientCertificate" "secretName" "" .Values.readyz)) -}}
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
