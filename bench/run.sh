#!/usr/bin/env bash
# Performance benchmark: extractedprism against HAProxy and nginx (stream)
# in front of the same local upstreams. Writes bench/RESULTS.md, keeping
# its hand-written section from a line "## History" to the end.
#
#   bench/run.sh                 full run (about 15 minutes on 2 cores; a
#                                fifth more with --baseline)
#   bench/run.sh --quick         smoke run (2 to 3 minutes)
#   bench/run.sh --baseline efbac2d
#                                also build git revision efbac2d (in a
#                                temporary git worktree, removed at exit) the
#                                way this tree is built, and run it as the
#                                system "baseline" beside extractedprism in
#                                every scenario, interleaved; the targets
#                                that name today's build compare with it
#   bench/run.sh --wait-quiet 30m
#                                first wait up to 30 min for the 1-minute load
#                                average to drop below 1.5 (the report says
#                                "measured under load" if it never does)
#   bench/run.sh -- -scenarios connrate,bulk -reps 3
#                                anything after -- goes to the bench program
#                                (cd bench && go run . -h lists the flags)
#   bench/run.sh --quick --baseline efbac2d -- -o /tmp/quick.md
#                                write the report elsewhere (a relative path
#                                is taken from bench/); RESULTS.md is untouched
#
# Needs root for apt-get (only when haproxy, nginx, its stream module or
# strace are missing) and for `ulimit -n 1048576`. Needs 2 CPUs: the load
# generator and the upstreams run on CPU 0, every proxy on CPU 1.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
command="bench/run.sh $*"

args=()
baseline=""
while [ $# -gt 0 ]; do
	case "$1" in
	--quick) args+=(-quick) ;;
	--wait-quiet | --baseline)
		if [ $# -lt 2 ]; then
			echo "run.sh: $1 needs a value (see the comment at the top)" >&2
			exit 2
		fi
		if [ "$1" = --baseline ]; then baseline="$2"; else args+=(-wait-quiet "$2"); fi
		shift ;;
	--) shift; args+=("$@"); break ;;
	*) echo "run.sh: unknown argument $1 (see the comment at the top)" >&2; exit 2 ;;
	esac
	shift
done

if [ -n "$baseline" ]; then
	if ! rev=$(git rev-parse --verify --quiet "$baseline^{commit}"); then
		echo "run.sh: --baseline $baseline is not a commit in this repository" >&2
		exit 2
	fi
	# The report's command line says which commit the name stood for.
	command+="  # baseline = ${rev:0:12}"
fi

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
tree=""
cleanup() {
	if [ -n "$tree" ]; then
		git -C "$root" worktree remove --force "$tree" || true
		git -C "$root" worktree prune
	fi
	rm -rf "$work"
}
trap cleanup EXIT

# build DIR OUT [FLAGS...] builds the extractedprism in DIR: one command
# for this tree and the baseline, so both are built alike.
build() {
	local dir=$1 out=$2
	shift 2
	(cd "$dir" && go build "$@" -o "$out" .)
}

echo "run.sh: building extractedprism and the bench program" >&2
build "$root" "$work/extractedprism"
build "$root" "$work/extractedprism-stripped" -ldflags='-s -w'
(cd bench && go build -o "$work/bench" .)
if [ -n "$baseline" ]; then
	echo "run.sh: building baseline $baseline (${rev:0:12}) in a git worktree" >&2
	tree="$work/baseline-src"
	git worktree add --detach "$tree" "$rev" >&2
	build "$tree" "$work/baseline"
	# Ahead of the arguments after --: a -systems there still decides what
	# runs (list baseline in it), and an -ep-alt there adds another build.
	args=(-ep-alt "baseline=$work/baseline" "${args[@]}")
fi

cd bench
taskset -c 0 "$work/bench" \
	-ep "$work/extractedprism" -ep-stripped "$work/extractedprism-stripped" \
	-proxy-cpu 1 -o "$root/bench/RESULTS.md" -command "$command" "${args[@]}"
