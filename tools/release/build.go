package main

import (
	"archive/tar"
	"bytes"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// imageMeta is what the labels and the config's created time come from.
type imageMeta struct {
	version, revision string
	created           time.Time
}

// labels are the Containerfile's, plus created, which a daemon build takes
// from the clock and this one from the commit.
func (m imageMeta) labels() map[string]string {
	return map[string]string{
		"org.opencontainers.image.title":       "extractedprism",
		"org.opencontainers.image.description": "Per-node TCP load balancer for the Kubernetes API server",
		"org.opencontainers.image.source":      "https://github.com/extractedprism/extractedprism",
		"org.opencontainers.image.version":     m.version,
		"org.opencontainers.image.revision":    m.revision,
		"org.opencontainers.image.licenses":    "BSD-3-Clause",
		"org.opencontainers.image.created":     m.created.Format(time.RFC3339),
	}
}

// binaryLayer is a tar holding one file, /extractedprism, root-owned,
// mode 0755, with the commit time as its modification time.
func binaryLayer(binary []byte, mtime time.Time) ([]byte, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	hdr := &tar.Header{
		Typeflag: tar.TypeReg,
		Name:     "extractedprism",
		Mode:     0o755,
		Size:     int64(len(binary)),
		ModTime:  mtime,
		Format:   tar.FormatUSTAR,
	}
	if err := tw.WriteHeader(hdr); err != nil {
		return nil, err
	}
	if _, err := tw.Write(binary); err != nil {
		return nil, err
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// platformImage is the image for one platform: the empty base, one layer,
// and the config the Containerfile's USER, EXPOSE, ENTRYPOINT and LABEL set.
func platformImage(meta imageMeta, b platformBinary) (v1.Image, error) {
	binary, err := os.ReadFile(b.path)
	if err != nil {
		return nil, err
	}
	tarBytes, err := binaryLayer(binary, meta.created)
	if err != nil {
		return nil, err
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(tarBytes)), nil
	}, tarball.WithMediaType(types.OCILayer))
	if err != nil {
		return nil, err
	}
	base := mutate.ConfigMediaType(mutate.MediaType(empty.Image, types.OCIManifestSchema1), types.OCIConfigJSON)
	img, err := mutate.Append(base, mutate.Addendum{Layer: layer, MediaType: types.OCILayer, History: v1.History{
		Created:   v1.Time{Time: meta.created},
		CreatedBy: "COPY extractedprism /extractedprism",
	}})
	if err != nil {
		return nil, err
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cfg = cfg.DeepCopy()
	cfg.OS, cfg.Architecture = b.os, b.arch
	cfg.Created = v1.Time{Time: meta.created}
	cfg.Config = v1.Config{
		User:         "7445:7445", // the daemon's own, as in the Containerfile
		Entrypoint:   []string{"/extractedprism"},
		ExposedPorts: map[string]struct{}{"7445/tcp": {}, "7446/tcp": {}},
		Labels:       meta.labels(),
	}
	return mutate.ConfigFile(img, cfg)
}

// writeLayout writes an OCI layout whose index.json names one image index,
// tagged with the version; that index lists one manifest per platform. It
// returns the digests, one line each, for the reproducibility check.
func writeLayout(dir string, meta imageMeta, bins binaries) (string, error) {
	if _, err := os.Stat(dir); err == nil {
		return "", fmt.Errorf("%s exists; the release writes into an empty dist/", dir)
	}
	idx := mutate.IndexMediaType(empty.Index, types.OCIImageIndex)
	var lines strings.Builder
	for _, b := range bins {
		img, err := platformImage(meta, b)
		if err != nil {
			return "", fmt.Errorf("%s/%s: %w", b.os, b.arch, err)
		}
		digest, err := img.Digest()
		if err != nil {
			return "", err
		}
		fmt.Fprintf(&lines, "%s/%s %s\n", b.os, b.arch, digest)
		idx = mutate.AppendManifests(idx, mutate.IndexAddendum{Add: img, Descriptor: v1.Descriptor{
			Platform: &v1.Platform{OS: b.os, Architecture: b.arch},
		}})
	}
	digest, err := idx.Digest()
	if err != nil {
		return "", err
	}
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		return "", err
	}
	ref := layout.WithAnnotations(map[string]string{"org.opencontainers.image.ref.name": meta.version})
	if err := p.AppendIndex(idx, ref); err != nil {
		return "", err
	}
	return fmt.Sprintf("index %s\n%s", digest, lines.String()), nil
}
