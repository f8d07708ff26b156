# make image: build the Containerfile with podman, or docker without podman.
# make release: the release command (tools/release/release.sh) into dist/;
# VERSION=vX.Y.Z overrides the tag on HEAD.
IMAGE ?= extractedprism
VERSION ?= devel
REVISION ?= $(shell git rev-parse HEAD 2>/dev/null || echo unknown)

.PHONY: image release
image:
	@engine=$$(command -v podman || command -v docker) || { \
		echo "make image: neither podman nor docker is installed; install one of them to build the Containerfile" >&2; exit 1; }; \
	echo "$$engine build -t $(IMAGE) ."; \
	"$$engine" build --build-arg VERSION=$(VERSION) --build-arg REVISION=$(REVISION) -t $(IMAGE) -f Containerfile .

release:
	tools/release/release.sh $(filter-out devel,$(VERSION))
