#!/usr/bin/env bash
# Builds kube-apiserver and etcd for the end-to-end tests into a cache outside
# the work tree, keyed by the Kubernetes version:
#
#   ${EP_E2E_CACHE:-/root/.cache/extractedprism-e2e}/v1.37.2/{kube-apiserver,etcd}
#
# Nothing happens when both binaries are already there. Both come from the Go
# module proxy as source and are built with -trimpath and CGO_ENABLED=0; no
# prebuilt binary is downloaded and kubectl is not needed.
#
# k8s.io/kubernetes cannot be required as an ordinary module: its go.mod
# replaces every staging module with a directory inside its own tree, and a
# dependency's replace directives are ignored. So a throw-away build module is
# generated that requires k8s.io/kubernetes and replaces each of those staging
# modules with its published v0.X.Y release. etcd is built in a second module,
# at the version Kubernetes itself requires, so that its dependencies are
# etcd's own and not bumped by Kubernetes'.
set -euo pipefail

K8S_VERSION=${EP_E2E_K8S_VERSION:-v1.37.2}
CACHE_ROOT=${EP_E2E_CACHE:-/root/.cache/extractedprism-e2e}
OUT="$CACHE_ROOT/$K8S_VERSION"

if [ -x "$OUT/kube-apiserver" ] && [ -x "$OUT/etcd" ]; then
	echo "build-binaries: $OUT already has kube-apiserver and etcd"
	exit 0
fi

mkdir -p "$OUT"
# The staging releases are tagged v0.<minor>.<patch> for Kubernetes v1.<minor>.<patch>.
STAGING_VERSION="v0.${K8S_VERSION#v1.}"
export CGO_ENABLED=0
export GOFLAGS=-mod=mod

work=$(mktemp -d "${TMPDIR:-/tmp}/ep-e2e-build.XXXXXX")
trap 'rm -rf "$work"' EXIT

start=$(date +%s)
k8s_dir=$(go mod download -json "k8s.io/kubernetes@$K8S_VERSION" |
	sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
if [ ! -f "$k8s_dir/go.mod" ]; then
	echo "build-binaries: cannot find the go.mod of k8s.io/kubernetes@$K8S_VERSION" >&2
	exit 1
fi
go_directive=$(awk '$1 == "go" { print $2; exit }' "$k8s_dir/go.mod")
etcd_version=$(awk '$1 == "go.etcd.io/etcd/server/v3" { print $2; exit }' "$k8s_dir/go.mod")
if [ -z "$etcd_version" ]; then
	echo "build-binaries: k8s.io/kubernetes@$K8S_VERSION does not require go.etcd.io/etcd/server/v3" >&2
	exit 1
fi

# Every "k8s.io/x => ./staging/src/k8s.io/x" line becomes "k8s.io/x => k8s.io/x v0.N.M".
replaces=$(awk '$2 == "=>" && $3 ~ /^\.\/staging\/src\// { print "\t" $1 " => " $1 " '"$STAGING_VERSION"'" }' "$k8s_dir/go.mod")
if [ -z "$replaces" ]; then
	echo "build-binaries: no staging replace lines found in $k8s_dir/go.mod" >&2
	exit 1
fi

mkdir -p "$work/apiserver" "$work/etcd"
cat >"$work/apiserver/go.mod" <<EOF
module extractedprism.invalid/e2e-build/apiserver

go $go_directive

tool k8s.io/kubernetes/cmd/kube-apiserver

require k8s.io/kubernetes $K8S_VERSION

replace (
$replaces
)
EOF

cat >"$work/etcd/go.mod" <<EOF
module extractedprism.invalid/e2e-build/etcd

go $go_directive

tool go.etcd.io/etcd/server/v3

require go.etcd.io/etcd/server/v3 $etcd_version
EOF

if [ ! -x "$OUT/etcd" ]; then
	echo "build-binaries: etcd $etcd_version"
	(cd "$work/etcd" && go mod tidy && go build -trimpath -o "$OUT/etcd.tmp" go.etcd.io/etcd/server/v3)
	mv "$OUT/etcd.tmp" "$OUT/etcd"
fi

if [ ! -x "$OUT/kube-apiserver" ]; then
	echo "build-binaries: kube-apiserver $K8S_VERSION (staging modules at $STAGING_VERSION)"
	# The version variables are what the release build sets, so /version
	# and the API server's own version checks see v1.37.2, not v0.0.0-master.
	major_minor=${K8S_VERSION#v}
	ldflags="-X k8s.io/component-base/version.gitVersion=$K8S_VERSION"
	ldflags="$ldflags -X k8s.io/component-base/version.gitMajor=${major_minor%%.*}"
	minor=${major_minor#*.}
	ldflags="$ldflags -X k8s.io/component-base/version.gitMinor=${minor%%.*}"
	ldflags="$ldflags -X k8s.io/component-base/version.gitTreeState=clean"
	(cd "$work/apiserver" && go mod tidy &&
		go build -trimpath -ldflags "$ldflags" -o "$OUT/kube-apiserver.tmp" k8s.io/kubernetes/cmd/kube-apiserver)
	mv "$OUT/kube-apiserver.tmp" "$OUT/kube-apiserver"
fi

echo "build-binaries: done in $(($(date +%s) - start))s: $OUT"
