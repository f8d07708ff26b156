#!/usr/bin/env bash
# Reproducibility check: the release command, run from two fresh clones of
# HEAD in different directories, at different times, in different time
# zones and umasks, the second with an empty build cache, must write the
# same bytes. Prints the image digests; exits 1 on the first difference.
set -euo pipefail
src=$(cd "$(dirname "$0")/../.." && pwd)
commit=$(git -C "$src" rev-parse HEAD)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

clone() { # directory
	git clone -q "$src" "$1"
	git -C "$1" checkout -q --detach "$commit"
}
a=$tmp/a/extractedprism
b=$tmp/second/clone/of/extractedprism
clone "$a"
clone "$b"

start=$(date +%s)
# The first run shares the machine's build cache (warm in CI after the
# tests); the second builds everything again in a cache of its own, so
# that a cached object cannot hide a difference.
(cd "$a" && TZ=UTC tools/release/release.sh >"$tmp/a.log" 2>&1) || { cat "$tmp/a.log"; exit 1; }
sleep 2
(cd "$b" && umask 0027 && TZ=Pacific/Chatham GOCACHE="$tmp/gocache-b" tools/release/release.sh >"$tmp/b.log" 2>&1) ||
	{ cat "$tmp/b.log"; exit 1; }
echo "reproduce.sh: two releases of $commit in $(($(date +%s) - start)) s"

status=0
for f in "$a"/dist/*; do
	name=${f##*/}
	[ -f "$f" ] || continue
	if ! cmp -s "$f" "$b/dist/$name"; then
		echo "reproduce.sh: $name differs between the two clones" >&2
		status=1
	fi
done
# The image layout, blob by blob (their names are their digests).
if ! diff -r "$a/dist/oci" "$b/dist/oci" >&2; then
	echo "reproduce.sh: the OCI image layouts differ" >&2
	status=1
fi
if ! cmp -s <(ls "$a/dist") <(ls "$b/dist"); then
	echo "reproduce.sh: the two dist/ hold different files" >&2
	status=1
fi
cat "$a/dist/SHA256SUMS" "$a/dist/image-digests.txt"
[ "$status" = 0 ] && echo "reproduce.sh: identical"
exit "$status"
