package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"time"
)

// maxChartEntry bounds what one archive entry may expand to; this chart's
// largest file is a few tens of kilobytes.
const maxChartEntry = 16 << 20

func runChart(args []string) error {
	fs := flag.NewFlagSet("chart", flag.ContinueOnError)
	created := fs.Int64("created", -1, "commit time, seconds since the epoch (SOURCE_DATE_EPOCH)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *created < 0 || fs.NArg() != 1 {
		return errors.New("want -created <unix> and one chart archive")
	}
	path := fs.Arg(0)
	in, err := os.ReadFile(path) //nolint:gosec // the path is release.sh's own argument
	if err != nil {
		return err
	}
	out, err := retimeArchive(in, time.Unix(*created, 0).UTC())
	if err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	return os.WriteFile(path, out, 0o644) //nolint:gosec // a published file, world-readable as helm writes it
}

// retimeArchive returns the gzipped tar in with the same entries in the
// same order, each with mtime as its time, and a gzip header without a
// time or name. Only regular files are expected: helm writes nothing else.
func retimeArchive(in []byte, mtime time.Time) ([]byte, error) {
	zr, err := gzip.NewReader(bytes.NewReader(in))
	if err != nil {
		return nil, err
	}
	tr := tar.NewReader(zr)
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	tw := tar.NewWriter(zw)
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, err
		}
		if hdr.Typeflag != tar.TypeReg {
			return nil, fmt.Errorf("%s: not a regular file (type %c)", hdr.Name, hdr.Typeflag)
		}
		next := &tar.Header{Typeflag: tar.TypeReg, Name: hdr.Name, Mode: hdr.Mode, Size: hdr.Size, ModTime: mtime}
		if err := tw.WriteHeader(next); err != nil {
			return nil, err
		}
		if hdr.Size > maxChartEntry {
			return nil, fmt.Errorf("%s: %d bytes, more than a chart file has", hdr.Name, hdr.Size)
		}
		if _, err := io.CopyN(tw, tr, hdr.Size); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	if err := zw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}
