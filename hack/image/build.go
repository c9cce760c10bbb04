package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"embed"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// The image's runtime settings. The Dockerfile states the same ones (dockerfile_test.go
// holds the two together).
const (
	// Entrypoint is where the binary lives in the image.
	Entrypoint = "/ironlb"
	// User is distroless' "nonroot"; the speaker's pod overrides it with root so that its
	// one capability, NET_RAW, is effective.
	User = "65532:65532"
	// Path is the PATH Docker gives an image built FROM scratch.
	Path = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
	// Title and Description are the labels that do not change between builds.
	Title       = "ironlb"
	Description = "MetalLB-compatible Layer-2 LoadBalancer for bare-metal Kubernetes"
	// DefaultSource and DefaultLicenses are the build flags' defaults.
	DefaultSource   = "https://github.com/ironlb/ironlb"
	DefaultLicenses = "Apache-2.0"
)

// rootfs holds the base layer's files (/etc/passwd, /etc/group); the Dockerfile copies
// the same directory.
//
//go:embed rootfs
var rootfs embed.FS

// Spec is everything that goes into the image: equal specs give equal digests.
type Spec struct {
	// Binaries maps a platform ("linux/amd64") to the static ironlb binary for it.
	Binaries map[string]string
	// Repository and Tag name the image (ghcr.io/ironlb/ironlb, 0.1.0).
	Repository, Tag string
	// Version, Revision, Source and Licenses become the standard OCI labels.
	Version, Revision, Source, Licenses string
	// Created is every timestamp in the image: config, history and file times
	// (SOURCE_DATE_EPOCH, normally the commit's time).
	Created time.Time
}

// Result is a built image: the multi-arch index and one image per platform.
type Result struct {
	Ref       name.Tag
	Index     v1.ImageIndex
	Platforms []string // sorted
	Images    map[string]v1.Image
}

// Labels returns the image's labels (the OCI annotation keys), also set as the index's
// annotations.
func (s Spec) Labels() map[string]string {
	return map[string]string{
		"org.opencontainers.image.title":       Title,
		"org.opencontainers.image.description": Description,
		"org.opencontainers.image.source":      s.Source,
		"org.opencontainers.image.revision":    s.Revision,
		"org.opencontainers.image.version":     s.Version,
		"org.opencontainers.image.licenses":    s.Licenses,
		"org.opencontainers.image.created":     s.Created.UTC().Format(time.RFC3339),
	}
}

func (s Spec) validate() error {
	var missing []string
	for _, f := range []struct{ name, v string }{
		{"repository", s.Repository}, {"tag", s.Tag}, {"version", s.Version},
		{"revision", s.Revision}, {"source", s.Source}, {"licenses", s.Licenses},
	} {
		if f.v == "" {
			missing = append(missing, f.name)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("image spec: %s must not be empty", strings.Join(missing, ", "))
	}
	if len(s.Binaries) == 0 {
		return errors.New("image spec: no binaries (want at least one --binary os/arch=path)")
	}
	if s.Created.IsZero() {
		return errors.New("image spec: no creation time (set --epoch or SOURCE_DATE_EPOCH)")
	}
	return nil
}

// Build assembles the image index: per platform a base layer (/etc/passwd, /etc/group,
// /tmp; the same for every platform) and a layer with the binary at Entrypoint.
func Build(s Spec) (*Result, error) {
	if err := s.validate(); err != nil {
		return nil, err
	}
	ref, err := name.NewTag(s.Repository + ":" + s.Tag)
	if err != nil {
		return nil, fmt.Errorf("image spec: repository %q, tag %q: %w", s.Repository, s.Tag, err)
	}
	base, err := baseLayer(s.Created)
	if err != nil {
		return nil, err
	}
	res := &Result{Ref: ref, Images: map[string]v1.Image{}}
	for p := range s.Binaries {
		res.Platforms = append(res.Platforms, p)
	}
	sort.Strings(res.Platforms)
	var adds []mutate.IndexAddendum
	for _, p := range res.Platforms {
		platform, err := v1.ParsePlatform(p)
		if err != nil {
			return nil, fmt.Errorf("binary for platform %q: %w", p, err)
		}
		if platform.OS != "linux" || platform.Architecture == "" {
			return nil, fmt.Errorf("binary for platform %q: want linux/ARCH[/VARIANT]", p)
		}
		img, err := platformImage(s, platform, base, s.Binaries[p])
		if err != nil {
			return nil, fmt.Errorf("image for %s: %w", p, err)
		}
		res.Images[p] = img
		adds = append(adds, mutate.IndexAddendum{Add: img, Descriptor: v1.Descriptor{Platform: platform}})
	}
	idx := mutate.AppendManifests(mutate.IndexMediaType(empty.Index, types.OCIImageIndex), adds...)
	res.Index = mutate.Annotations(idx, s.Labels()).(v1.ImageIndex)
	return res, nil
}

func platformImage(s Spec, platform *v1.Platform, base v1.Layer, binary string) (v1.Image, error) {
	bin, err := binaryLayer(binary, s.Created)
	if err != nil {
		return nil, err
	}
	img, err := mutate.ConfigFile(empty.Image, &v1.ConfigFile{
		Architecture: platform.Architecture,
		OS:           platform.OS,
		Variant:      platform.Variant,
		Config: v1.Config{
			Entrypoint: []string{Entrypoint},
			User:       User,
			Env:        []string{Path},
			WorkingDir: "/",
			Labels:     s.Labels(),
		},
		RootFS: v1.RootFS{Type: "layers"},
	})
	if err != nil {
		return nil, err
	}
	created := v1.Time{Time: s.Created.UTC()}
	img, err = mutate.Append(img,
		mutate.Addendum{Layer: base, History: v1.History{Created: created, CreatedBy: "ironlb-image: /etc/passwd, /etc/group, /tmp", Comment: "base"}},
		mutate.Addendum{Layer: bin, History: v1.History{Created: created, CreatedBy: "ironlb-image: " + Entrypoint, Comment: "binary"}},
	)
	if err != nil {
		return nil, err
	}
	if img, err = mutate.CreatedAt(img, created); err != nil {
		return nil, err
	}
	img = mutate.MediaType(img, types.OCIManifestSchema1)
	return mutate.ConfigMediaType(img, types.OCIConfigJSON), nil
}

// tarEntry is one file or directory of a layer; every entry is owned by root and
// carries the spec's creation time.
type tarEntry struct {
	name string
	mode int64
	dir  bool
	data []byte
}

func baseLayer(created time.Time) (v1.Layer, error) {
	entries := []tarEntry{{name: "etc/", mode: 0o755, dir: true}}
	err := fs.WalkDir(rootfs, "rootfs/etc", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		data, err := rootfs.ReadFile(p)
		if err != nil {
			return err
		}
		entries = append(entries, tarEntry{name: strings.TrimPrefix(p, "rootfs/"), mode: 0o644, data: data})
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("base files: %w", err)
	}
	// Writable by everyone, sticky: the webhook's default certificate directory is under it.
	entries = append(entries, tarEntry{name: "tmp/", mode: 0o1777, dir: true})
	return tarLayer(entries, created)
}

func binaryLayer(binary string, created time.Time) (v1.Layer, error) {
	data, err := os.ReadFile(binary)
	if err != nil {
		return nil, fmt.Errorf("reading the binary: %w", err)
	}
	if !bytes.HasPrefix(data, []byte("\x7fELF")) {
		return nil, fmt.Errorf("binary %s is not an ELF executable", binary)
	}
	return tarLayer([]tarEntry{{name: strings.TrimPrefix(Entrypoint, "/"), mode: 0o755, data: data}}, created)
}

// tarLayer writes entries (in order) into a gzip-compressed layer. Nothing but the
// entries and created goes into it, so it is the same byte for byte on every build.
// gzip's default level: -9 makes the binary layer 0.8% smaller for 3 times the CPU.
func tarLayer(entries []tarEntry, created time.Time) (v1.Layer, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		h := &tar.Header{
			Name: e.name, Mode: e.mode, Size: int64(len(e.data)), ModTime: created.UTC(),
			Typeflag: tar.TypeReg, Format: tar.FormatPAX,
		}
		if e.dir {
			h.Typeflag, h.Size = tar.TypeDir, 0
		}
		if err := tw.WriteHeader(h); err != nil {
			return nil, fmt.Errorf("layer entry %s: %w", e.name, err)
		}
		if _, err := tw.Write(e.data); err != nil {
			return nil, fmt.Errorf("layer entry %s: %w", e.name, err)
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	data := buf.Bytes()
	return tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(data)), nil
	}, tarball.WithCompressionLevel(gzip.DefaultCompression), tarball.WithMediaType(types.OCILayer))
}

// Written says where Write put the image.
type Written struct {
	Layout   string            // OCI image layout directory
	Archives map[string]string // platform -> `docker load` tarball
	Digest   v1.Hash           // the index's digest
	// Unchanged: dir held this image already and was left as it was.
	Unchanged bool
}

// Write stores the image under dir: dir/oci (an OCI image layout holding the index,
// replaced as a whole), dir/ironlb-OS-ARCH.tar (a `docker load`/`kind load
// image-archive` tarball per platform) and dir/digest (the index's digest). When dir
// already holds this digest, nothing is rewritten (the lab's agents may be reading it).
func (r *Result) Write(dir string) (*Written, error) {
	digest, err := r.Index.Digest()
	if err != nil {
		return nil, err
	}
	w := &Written{Layout: filepath.Join(dir, "oci"), Archives: map[string]string{}, Digest: digest}
	for _, p := range r.Platforms {
		w.Archives[p] = filepath.Join(dir, "ironlb-"+strings.ReplaceAll(p, "/", "-")+".tar")
	}
	if r.unchanged(dir, w) {
		w.Unchanged = true
		return w, nil
	}
	// Written last, so a half-written directory never looks complete.
	if err := os.RemoveAll(filepath.Join(dir, "digest")); err != nil {
		return nil, err
	}
	if err := os.RemoveAll(w.Layout); err != nil {
		return nil, err
	}
	lp, err := layout.Write(w.Layout, empty.Index)
	if err != nil {
		return nil, fmt.Errorf("writing the image layout: %w", err)
	}
	err = lp.AppendIndex(r.Index, layout.WithAnnotations(map[string]string{
		"org.opencontainers.image.ref.name": r.Ref.TagStr(),
		// containerd (ctr images import, kind) names the image after this.
		"io.containerd.image.name": r.Ref.Name(),
	}))
	if err != nil {
		return nil, fmt.Errorf("writing the image layout: %w", err)
	}
	for _, p := range r.Platforms {
		if err := tarball.WriteToFile(w.Archives[p], r.Ref, r.Images[p]); err != nil {
			return nil, fmt.Errorf("writing %s: %w", w.Archives[p], err)
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "digest"), []byte(digest.String()+"\n"), 0o644); err != nil {
		return nil, err
	}
	return w, nil
}

// unchanged says whether dir holds this very image already.
func (r *Result) unchanged(dir string, w *Written) bool {
	old, err := os.ReadFile(filepath.Join(dir, "digest"))
	if err != nil || strings.TrimSpace(string(old)) != w.Digest.String() {
		return false
	}
	idx, err := LoadIndex(w.Layout)
	if err != nil {
		return false
	}
	if d, err := idx.Digest(); err != nil || d != w.Digest {
		return false
	}
	for _, f := range w.Archives {
		if _, err := os.Stat(f); err != nil {
			return false
		}
	}
	return true
}

// Summary describes the written image for the build log: reference with digest and,
// per platform, manifest digest, compressed size and archive.
func (r *Result) Summary(w *Written) (string, error) {
	var b strings.Builder
	state := ""
	if w.Unchanged {
		state = ", unchanged"
	}
	fmt.Fprintf(&b, "%s@%s (OCI image index in %s%s)\n", r.Ref.Name(), w.Digest, w.Layout, state)
	for _, p := range r.Platforms {
		img := r.Images[p]
		d, err := img.Digest()
		if err != nil {
			return "", err
		}
		layers, err := img.Layers()
		if err != nil {
			return "", err
		}
		var size int64
		for _, l := range layers {
			n, err := l.Size()
			if err != nil {
				return "", err
			}
			size += n
		}
		fmt.Fprintf(&b, "  %-12s %s  %.1f MiB compressed  %s\n", p, d, float64(size)/(1<<20), path.Base(w.Archives[p]))
	}
	return b.String(), nil
}
