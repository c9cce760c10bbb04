// Command ironlb-image assembles ironlb's container image without Docker, and pushes it.
//
//	ironlb-image build --binary linux/amd64=bin/image/ironlb-linux-amd64 \
//	    --binary linux/arm64=bin/image/ironlb-linux-arm64 --repository ghcr.io/ironlb/ironlb \
//	    --tag 0.1.0 --version 0.1.0 --revision COMMIT --source URL --licenses Apache-2.0 \
//	    --epoch SOURCE_DATE_EPOCH --out bin/image
//	ironlb-image push --layout bin/image/oci --ref ghcr.io/ironlb/ironlb:0.1.0
//	ironlb-image registry --listen 127.0.0.1:0 --addr-file FILE
//
// build writes a multi-arch OCI image index (an image layout directory, a `docker load`
// tarball per platform, and the digest) from static binaries, with no base image: the
// base layer (/etc/passwd, /etc/group, /tmp) is made here. Every timestamp is the epoch
// given, so two builds of one commit give one digest. `make image` runs it; the release
// workflow runs push; its dry run (hack/release.sh --dry-run) pushes to registry, an
// in-memory registry on loopback. The Dockerfile describes the same image for people with Docker.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"time"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "ironlb-image:", err)
		stop()
		os.Exit(1)
	}
}

const usage = "usage: ironlb-image build|push|registry [flags] (-h for the flags)"

func run(ctx context.Context, args []string) error {
	if len(args) == 0 {
		return errors.New(usage)
	}
	switch args[0] {
	case "build":
		return runBuild(args[1:])
	case "push":
		return runPush(ctx, args[1:])
	case "registry":
		return runRegistry(ctx, args[1:])
	}
	return fmt.Errorf("unknown command %q; %s", args[0], usage)
}

func newFlagSet(name string) *flag.FlagSet {
	return flag.NewFlagSet("ironlb-image "+name, flag.ContinueOnError)
}

// binaryFlags collects repeated --binary PLATFORM=PATH flags.
type binaryFlags map[string]string

func (b binaryFlags) String() string { return fmt.Sprint(map[string]string(b)) }

func (b binaryFlags) Set(v string) error {
	platform, file, ok := strings.Cut(v, "=")
	if !ok || platform == "" || file == "" {
		return fmt.Errorf("--binary %q: want PLATFORM=PATH, e.g. linux/amd64=bin/image/ironlb-linux-amd64", v)
	}
	if _, dup := b[platform]; dup {
		return fmt.Errorf("--binary %q: platform %s given twice", v, platform)
	}
	b[platform] = file
	return nil
}

func runBuild(args []string) error {
	fs := newFlagSet("build")
	bins := binaryFlags{}
	var s Spec
	fs.Var(bins, "binary", "PLATFORM=PATH of a static ironlb binary, once per platform (linux/amd64=...)")
	fs.StringVar(&s.Repository, "repository", "ghcr.io/ironlb/ironlb", "image repository")
	fs.StringVar(&s.Tag, "tag", "", "image tag (the chart's appVersion)")
	fs.StringVar(&s.Version, "version", "", "org.opencontainers.image.version")
	fs.StringVar(&s.Revision, "revision", "", "org.opencontainers.image.revision (the commit)")
	fs.StringVar(&s.Source, "source", DefaultSource, "org.opencontainers.image.source")
	fs.StringVar(&s.Licenses, "licenses", DefaultLicenses, "org.opencontainers.image.licenses (SPDX)")
	epoch := fs.String("epoch", os.Getenv("SOURCE_DATE_EPOCH"), "every timestamp in the image, seconds since 1970 (default $SOURCE_DATE_EPOCH)")
	out := fs.String("out", "bin/image", "output directory")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("build: unexpected arguments %q", fs.Args())
	}
	sec, err := strconv.ParseInt(*epoch, 10, 64)
	if err != nil || sec < 0 {
		return fmt.Errorf("build: --epoch %q: want seconds since 1970 (e.g. git log -1 --format=%%ct)", *epoch)
	}
	s.Created = time.Unix(sec, 0).UTC()
	s.Binaries = bins
	res, err := Build(s)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(*out, 0o755); err != nil {
		return err
	}
	w, err := res.Write(*out)
	if err != nil {
		return err
	}
	sum, err := res.Summary(w)
	if err != nil {
		return err
	}
	fmt.Print(sum)
	return nil
}

func runPush(ctx context.Context, args []string) error {
	fs := newFlagSet("push")
	dir := fs.String("layout", "bin/image/oci", "OCI image layout written by build")
	ref := fs.String("ref", "", "where to push, e.g. ghcr.io/ironlb/ironlb:0.1.0")
	digestFile := fs.String("digest-file", "", "also write the pushed digest to this file")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *ref == "" || fs.NArg() > 0 {
		return errors.New("push: want --ref REPOSITORY:TAG and no arguments")
	}
	d, err := Push(ctx, *dir, *ref)
	if err != nil {
		return err
	}
	if *digestFile != "" {
		if err := os.WriteFile(*digestFile, []byte(d.String()+"\n"), 0o644); err != nil {
			return err
		}
	}
	fmt.Printf("%s@%s\n", *ref, d)
	return nil
}
