package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"io"
	"os"
	"path/filepath"
	"testing"
	"time"
)

var testMeta = imageMeta{version: "v1.2.3", revision: "0123456789abcdef0123456789abcdef01234567", created: time.Unix(1700000000, 0).UTC()}

// writeBinary puts a stand-in for the static binary in a temporary file.
func writeBinary(t *testing.T, content string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "extractedprism")
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// The layer must unpack to what COPY in the Containerfile gives: one file,
// /extractedprism, root-owned and executable, with the commit's time.
func TestBinaryLayerHeader(t *testing.T) {
	layer, err := binaryLayer([]byte("ELF"), testMeta.created)
	if err != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(bytes.NewReader(layer))
	hdr, err := tr.Next()
	if err != nil {
		t.Fatal(err)
	}
	if hdr.Name != "extractedprism" || hdr.Mode != 0o755 || hdr.Uid != 0 || hdr.Gid != 0 || hdr.Typeflag != tar.TypeReg {
		t.Errorf("header %+v: want regular file extractedprism, mode 0755, owner 0:0", hdr)
	}
	if !hdr.ModTime.Equal(testMeta.created) {
		t.Errorf("mtime %v, want the commit time %v", hdr.ModTime, testMeta.created)
	}
	if body, _ := io.ReadAll(tr); string(body) != "ELF" {
		t.Errorf("content %q, want the binary", body)
	}
	if _, err := tr.Next(); err != io.EOF {
		t.Errorf("a second entry in the layer (err %v)", err)
	}
}

func TestPlatformImageConfig(t *testing.T) {
	img, err := platformImage(testMeta, platformBinary{"linux", "arm64", writeBinary(t, "ELF")})
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	c := cfg.Config
	if cfg.OS != "linux" || cfg.Architecture != "arm64" || c.User != "7445:7445" ||
		len(c.Entrypoint) != 1 || c.Entrypoint[0] != "/extractedprism" || len(c.ExposedPorts) != 2 {
		t.Errorf("config %+v", cfg)
	}
	for _, port := range []string{"7445/tcp", "7446/tcp"} {
		if _, ok := c.ExposedPorts[port]; !ok {
			t.Errorf("port %s not exposed", port)
		}
	}
	want := map[string]string{
		"org.opencontainers.image.version":  "v1.2.3",
		"org.opencontainers.image.revision": testMeta.revision,
		"org.opencontainers.image.licenses": "BSD-3-Clause",
		"org.opencontainers.image.created":  "2023-11-14T22:13:20Z",
	}
	for k, v := range want {
		if c.Labels[k] != v {
			t.Errorf("label %s = %q, want %q", k, c.Labels[k], v)
		}
	}
	if !cfg.Created.Equal(testMeta.created) {
		t.Errorf("created %v, want the commit time", cfg.Created)
	}
}

// Two layouts written from the same inputs in different directories must
// name the same index; a different binary must not. (Runs at different
// times, from different clones, are reproduce.sh's part.)
func TestLayoutDigestReproducible(t *testing.T) {
	bins := binaries{{"linux", "amd64", writeBinary(t, "amd64")}, {"linux", "arm64", writeBinary(t, "arm64")}}
	first, err := writeLayout(filepath.Join(t.TempDir(), "oci"), testMeta, bins)
	if err != nil {
		t.Fatal(err)
	}
	second, err := writeLayout(filepath.Join(t.TempDir(), "oci"), testMeta, bins)
	if err != nil {
		t.Fatal(err)
	}
	if first != second {
		t.Errorf("digests differ:\n%s\n%s", first, second)
	}
	bins[1].path = writeBinary(t, "arm64, changed")
	third, err := writeLayout(filepath.Join(t.TempDir(), "oci"), testMeta, bins)
	if err != nil {
		t.Fatal(err)
	}
	if third == first {
		t.Errorf("a changed binary kept the digests %s", first)
	}
}

// retimeArchive must keep names, order, modes and contents, and set every
// time, whatever the clock said when helm wrote the archive.
func TestRetimeArchive(t *testing.T) {
	archive := func(mtime time.Time) []byte {
		var buf bytes.Buffer
		zw := gzip.NewWriter(&buf)
		zw.ModTime = mtime
		tw := tar.NewWriter(zw)
		for _, name := range []string{"extractedprism/Chart.yaml", "extractedprism/values.yaml"} {
			if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: 0o644, Size: 4, ModTime: mtime}); err != nil {
				t.Fatal(err)
			}
			if _, err := tw.Write([]byte("data")); err != nil {
				t.Fatal(err)
			}
		}
		if err := tw.Close(); err != nil {
			t.Fatal(err)
		}
		if err := zw.Close(); err != nil {
			t.Fatal(err)
		}
		return buf.Bytes()
	}
	a, err := retimeArchive(archive(time.Unix(1, 0)), testMeta.created)
	if err != nil {
		t.Fatal(err)
	}
	b, err := retimeArchive(archive(time.Unix(2e9, 0)), testMeta.created)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(a, b) {
		t.Fatal("archives written at different times differ after retiming")
	}
	zr, err := gzip.NewReader(bytes.NewReader(a))
	if err != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(zr)
	for _, want := range []string{"extractedprism/Chart.yaml", "extractedprism/values.yaml"} {
		hdr, err := tr.Next()
		if err != nil {
			t.Fatal(err)
		}
		if hdr.Name != want || hdr.Mode != 0o644 || !hdr.ModTime.Equal(testMeta.created) {
			t.Errorf("entry %+v, want %s, 0644, the commit time", hdr, want)
		}
	}
}
