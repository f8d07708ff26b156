#!/usr/bin/env bash
# CI for the deployment artefacts: builds the pinned helm once into a cache
# outside the work tree, then runs the chart, manifest, static-binary and
# API-server tests of this module. Needs only Go and the Go module proxy,
# and git with the whole history: the tests run the daemon of the release
# the chart and the examples pin, built from that release's commit
# (render_test.go's package comment).
#
#   tools/deploytest/ci.sh
#
# EXTRACTEDPRISM_TOOLS moves the helm cache (default ~/.cache/extractedprism-tools).
# EP_SYSTEMD_REQUIRE=1 fails the systemd example tests where systemd-analyze
# or setpriv is missing, instead of skipping them (systemd_test.go).
# EP_E2E_BIN_DIR and EP_E2E_REQUIRE=1 steer the API-server test; see
# apiserver_test.go.
set -euo pipefail
cd "$(dirname "$0")"

# Keep in step with helmVersion in render_test.go.
HELM_VERSION=v3.22.0
TOOLS=${EXTRACTEDPRISM_TOOLS:-$HOME/.cache/extractedprism-tools}
HELM_DIR="$TOOLS/helm-$HELM_VERSION"

if ! command -v go >/dev/null 2>&1; then
	echo "ci.sh: go is not on PATH; install Go 1.26 or later" >&2
	exit 1
fi
go version

if [ ! -x "$HELM_DIR/helm" ]; then
	echo "ci.sh: building helm $HELM_VERSION into $HELM_DIR"
	mkdir -p "$HELM_DIR"
	# A go-installed helm carries no version stamp: it reports "v3.22" and
	# assumes Kubernetes v1.20. The tests pass no --kube-version, so a
	# kubeVersion constraint in Chart.yaml that a user's from-source helm
	# would refuse fails them here first.
	GOBIN="$HELM_DIR" go install "helm.sh/helm/v3/cmd/helm@$HELM_VERSION"
fi
export HELM="$HELM_DIR/helm"
"$HELM" version --short

unformatted=$(gofmt -l .)
if [ -n "$unformatted" ]; then
	echo "ci.sh: gofmt would change: $unformatted" >&2
	exit 1
fi
go vet ./...

# -v shows which tests ran and why the API-server test skipped, if it did.
go test -count=1 -timeout 10m -v ./...
