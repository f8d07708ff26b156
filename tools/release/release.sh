#!/usr/bin/env bash
# The release: everything a tag publishes, written into dist/ and nothing
# published. The release workflow runs this and pushes what it wrote; CI
# runs it twice from two clones (reproduce.sh) and compares the results.
#
#   tools/release/release.sh [vX.Y.Z]
#
# Without an argument the version is the tag on HEAD, else the version
# whose CHANGELOG.md heading HEAD adds, else v0.0.0-<rev>. dist/ gets, for linux/amd64 and linux/arm64:
#   extractedprism-<v>-linux-<arch>           static binary
#   extractedprism-<v>-linux-<arch>.cdx.json  CycloneDX SBOM of the modules in it
#   extractedprism-<chart version>.tgz        the Helm chart
#   image-digests.txt                         digests of the image index and its manifests
#   oci/                                      the image, an OCI image layout
#   SHA256SUMS                                of every file above but oci/
# Nothing depends on the clock, the directory or the host: times are the
# commit time, so a second run of one commit with the same Go gives the
# same bytes.
set -euo pipefail
cd "$(dirname "$0")/../.."

# Keep in step with tools/deploytest/ci.sh.
HELM_VERSION=v3.22.0
CYCLONEDX_VERSION=v1.10.0
TOOLS=${EXTRACTEDPRISM_TOOLS:-$HOME/.cache/extractedprism-tools}

# A binary stamped with a revision it was not built from is worse than none.
if ! git diff --quiet HEAD --; then
	echo "release.sh: the work tree has uncommitted changes; commit or stash them" >&2
	exit 1
fi
REVISION=$(git rev-parse HEAD)
# A release vX.Y.Z is the commit that adds "## [X.Y.Z]" to CHANGELOG.md:
# the oldest that touches a line starting so, as a later one may correct
# the date (a clone may come without tags; tools/deploytest finds it the
# same way, pinned_test.go). Without an argument or a
# tag on HEAD, the version is the one whose heading HEAD adds.
added=$(git diff-tree -p --no-commit-id HEAD -- CHANGELOG.md | sed -n 's/^+## \[\([0-9][0-9.]*\)\].*/v\1/p' | head -1)
VERSION=${1:-$(git describe --tags --exact-match 2>/dev/null || echo "${added:-v0.0.0-$(git rev-parse --short=12 HEAD)}")}
if ! [[ $VERSION =~ ^v[0-9]+\.[0-9]+\.[0-9]+(-[0-9A-Za-z.-]+)?$ ]]; then
	echo "release.sh: version $VERSION is not vX.Y.Z[-pre]" >&2
	exit 1
fi
if [[ $VERSION =~ ^v[0-9]+\.[0-9]+\.[0-9]+$ ]]; then
	if [ "$(git rev-parse --is-shallow-repository)" = true ]; then
		echo "release.sh: a shallow clone cannot show which commit released $VERSION; fetch the whole history (git fetch --unshallow)" >&2
		exit 1
	fi
	release_commit=$(git log --full-history --topo-order --format=%H -G "^## \[${VERSION#v}\]" -- CHANGELOG.md | tail -1)
	if [ "$release_commit" != "$REVISION" ]; then
		echo "release.sh: $VERSION is the commit that adds \"## [${VERSION#v}]\" to CHANGELOG.md (${release_commit:-none yet}), not HEAD $REVISION" >&2
		exit 1
	fi
fi
# The Go that go.mod names, whatever Go is installed (the go command fetches
# it through the module proxy): another compiler writes other bytes.
GOTOOLCHAIN=go$(awk '$1 == "go" {print $2}' go.mod)
export GOTOOLCHAIN
SOURCE_DATE_EPOCH=$(git log -1 --format=%ct HEAD)
export SOURCE_DATE_EPOCH
echo "release.sh: $VERSION, revision $REVISION, commit time $SOURCE_DATE_EPOCH, $(go version)"

# -trimpath: the SBOM records the generator's own hash, which without it
# would depend on the module cache's path.
install_tool() { # dir, package@version
	if [ ! -x "$TOOLS/$1/$(basename "${2%@*}")" ]; then
		mkdir -p "$TOOLS/$1"
		GOBIN="$TOOLS/$1" go install -trimpath "$2"
	fi
}
install_tool "helm-$HELM_VERSION" "helm.sh/helm/v3/cmd/helm@$HELM_VERSION"
install_tool "cyclonedx-gomod-$CYCLONEDX_VERSION" "github.com/CycloneDX/cyclonedx-gomod/cmd/cyclonedx-gomod@$CYCLONEDX_VERSION"

rm -rf dist
mkdir dist
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

for arch in amd64 arm64; do
	bin=dist/extractedprism-$VERSION-linux-$arch
	# -buildvcs=false: the version and revision are stamped; the VCS
	# settings would add only "modified", which an untracked file in the
	# clone turns true.
	CGO_ENABLED=0 GOOS=linux GOARCH=$arch go build -trimpath -buildvcs=false \
		-ldflags "-s -w -X main.Version=$VERSION -X main.Revision=$REVISION" -o "$bin" .
	# The SBOM of the modules linked into the binary, read from the build
	# info the binary carries (bin mode needs no git, unlike app mode).
	# -noserial and -notimestamp: a random serial and the clock would make
	# every run differ; the version names the build. No -licenses: it would
	# fetch this module at $VERSION from the proxy, before it is published.
	"$TOOLS/cyclonedx-gomod-$CYCLONEDX_VERSION/cyclonedx-gomod" bin \
		-json -std -noserial -notimestamp -version "$VERSION" -output "$bin.cdx.json" "$bin"
done

(cd tools/release && go build -trimpath -o "$work/release" .)
"$work/release" image -out dist/oci -version "$VERSION" -revision "$REVISION" -created "$SOURCE_DATE_EPOCH" \
	-binary "linux/amd64=dist/extractedprism-$VERSION-linux-amd64" \
	-binary "linux/arm64=dist/extractedprism-$VERSION-linux-arm64" >dist/image-digests.txt

# appVersion without the v, as the chart's own default and the examples
# name the image (the release pushes both tags); Artifact Hub's image
# annotation must name the same tag, which helm package does not change.
cp -R charts/extractedprism "$work/chart"
sed -i "s#^\(      image: ghcr.io/extractedprism/extractedprism:\).*#\1${VERSION#v}#" "$work/chart/Chart.yaml"
grep -q "^      image: ghcr.io/extractedprism/extractedprism:${VERSION#v}\$" "$work/chart/Chart.yaml" || {
	echo "release.sh: the artifacthub.io/images annotation in charts/extractedprism/Chart.yaml no longer has the expected form" >&2
	exit 1
}
"$TOOLS/helm-$HELM_VERSION/helm" package "$work/chart" --version "${VERSION#v}" --app-version "${VERSION#v}" -d "$work" >/dev/null
# helm stamps every archive entry with the clock; the entries' times become
# the commit time, the contents stay as helm wrote them.
"$work/release" chart -created "$SOURCE_DATE_EPOCH" "$work/extractedprism-${VERSION#v}.tgz"
mv "$work/extractedprism-${VERSION#v}.tgz" dist/

(cd dist && find . -maxdepth 1 -type f -printf '%P\n' | LC_ALL=C sort | xargs sha256sum >"$work/SHA256SUMS") && mv "$work/SHA256SUMS" dist/
cat dist/SHA256SUMS dist/image-digests.txt
