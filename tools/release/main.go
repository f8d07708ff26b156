// Command release holds the two steps of release.sh that no installed tool
// does reproducibly.
//
// "image" writes the extractedprism container image, for linux/amd64 and
// linux/arm64, as an OCI image layout, without a container daemon. It
// builds what the Containerfile builds (an empty base, the static binary,
// the same user, ports, entrypoint and labels), and nothing in it depends
// on the clock or the host: the layer's file times and the image's created
// time are the commit time, so two builds of one commit have one digest.
//
//	release image -out dist/oci -version v1.2.3 -revision <commit> -created <unix> \
//	      -binary linux/amd64=dist/extractedprism-v1.2.3-linux-amd64 \
//	      -binary linux/arm64=dist/extractedprism-v1.2.3-linux-arm64
//
// "chart" rewrites a chart archive from helm package with every entry's
// time set to the commit time: helm stamps each entry with the clock.
//
//	release chart -created <unix> dist/extractedprism-1.2.3.tgz
package main

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"
	"time"
)

func main() {
	var err error
	switch cmd := append(os.Args[1:], "")[0]; cmd {
	case "image":
		err = runImage(os.Args[2:])
	case "chart":
		err = runChart(os.Args[2:])
	default:
		err = fmt.Errorf("usage: release image|chart [flags]; unknown command %q", cmd)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "release:", err)
		os.Exit(1)
	}
}

// binaries collects the repeated -binary os/arch=path flags in their order,
// which is the order of the index's manifests.
type binaries []platformBinary

type platformBinary struct{ os, arch, path string }

func (b *binaries) String() string { return fmt.Sprint(*b) }

func (b *binaries) Set(v string) error {
	platform, path, ok := strings.Cut(v, "=")
	goos, arch, ok2 := strings.Cut(platform, "/")
	if !ok || !ok2 || path == "" {
		return fmt.Errorf("want os/arch=path, got %q", v)
	}
	*b = append(*b, platformBinary{goos, arch, path})
	return nil
}

func runImage(args []string) error {
	fs := flag.NewFlagSet("image", flag.ContinueOnError)
	out := fs.String("out", "", "directory for the OCI image layout (must not exist)")
	var meta imageMeta
	fs.StringVar(&meta.version, "version", "", "release version, e.g. v1.2.3")
	fs.StringVar(&meta.revision, "revision", "", "full commit hash")
	created := fs.Int64("created", -1, "commit time, seconds since the epoch (SOURCE_DATE_EPOCH)")
	var bins binaries
	fs.Var(&bins, "binary", "os/arch=path of a static binary; repeat per platform")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *out == "" || meta.version == "" || meta.revision == "" || *created < 0 || len(bins) == 0 {
		return errors.New("-out, -version, -revision, -created and at least one -binary are required")
	}
	meta.created = time.Unix(*created, 0).UTC()
	digests, err := writeLayout(*out, meta, bins)
	if err != nil {
		return err
	}
	_, err = fmt.Fprint(os.Stdout, digests)
	return err
}
