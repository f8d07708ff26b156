#!/usr/bin/env bash
# Performance benchmark: extractedprism against HAProxy and nginx (stream)
# in front of the same local upstreams. Writes bench/RESULTS.md, keeping
# its hand-written section from a line "## History" to the end.
#
#   bench/run.sh                 full run (about 15 minutes on 2 cores)
#   bench/run.sh --quick         smoke run (under 2 minutes)
#   bench/run.sh --wait-quiet 30m
#                                first wait up to 30 min for the 1-minute load
#                                average to drop below 1.5 (the report says
#                                "measured under load" if it never does)
#   bench/run.sh -- -scenarios connrate,bulk -reps 3
#                                anything after -- goes to the bench program
#                                (cd bench && go run . -h lists the flags)
#
# Needs root for apt-get (only when haproxy, nginx, its stream module or
# strace are missing) and for `ulimit -n 1048576`. Needs 2 CPUs: the load
# generator and the upstreams run on CPU 0, every proxy on CPU 1.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
command="bench/run.sh $*"

args=()
while [ $# -gt 0 ]; do
	case "$1" in
	--quick) args+=(-quick) ;;
	--wait-quiet) args+=(-wait-quiet "$2"); shift ;;
	--) shift; args+=("$@"); break ;;
	*) echo "run.sh: unknown argument $1 (see the comment at the top)" >&2; exit 2 ;;
	esac
	shift
done

if [ "$(nproc --all)" -lt 2 ]; then
	echo "run.sh: needs at least 2 CPUs (proxies on CPU 1, load on CPU 0)" >&2
	exit 1
fi

# The peers, from Debian's packages, when missing.
need=()
command -v haproxy >/dev/null || need+=(haproxy)
command -v nginx >/dev/null || need+=(nginx)
[ -e /usr/lib/nginx/modules/ngx_stream_module.so ] || need+=(libnginx-mod-stream)
command -v strace >/dev/null || need+=(strace)
command -v taskset >/dev/null || need+=(util-linux)
if [ ${#need[@]} -gt 0 ]; then
	echo "run.sh: installing ${need[*]}" >&2
	apt-get update
	DEBIAN_FRONTEND=noninteractive apt-get install -y "${need[@]}"
fi

# Idle connections need many descriptors in the proxies and the generator.
ulimit -n 1048576 2>/dev/null || ulimit -n "$(ulimit -Hn)"

work=$(mktemp -d /tmp/ep-bench-build.XXXXXX)
trap 'rm -rf "$work"' EXIT
echo "run.sh: building extractedprism and the bench program" >&2
go build -o "$work/extractedprism" .
go build -ldflags='-s -w' -o "$work/extractedprism-stripped" .
(cd bench && go build -o "$work/bench" .)

cd bench
taskset -c 0 "$work/bench" \
	-ep "$work/extractedprism" -ep-stripped "$work/extractedprism-stripped" \
	-proxy-cpu 1 -o "$root/bench/RESULTS.md" -command "$command" "${args[@]}"
