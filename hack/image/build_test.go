package main

import (
	"archive/tar"
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// testSpec returns a spec with two small fake ELF binaries (the tool only checks the
// magic number; the image is the same whatever the binary holds).
func testSpec(t *testing.T) Spec {
	t.Helper()
	dir := t.TempDir()
	bins := map[string]string{}
	for _, p := range []string{"linux/amd64", "linux/arm64"} {
		f := filepath.Join(dir, strings.ReplaceAll(p, "/", "-"))
		if err := os.WriteFile(f, []byte("\x7fELF fake ironlb for "+p), 0o755); err != nil {
			t.Fatal(err)
		}
		bins[p] = f
	}
	return Spec{
		Binaries: bins, Repository: "ghcr.io/ironlb/ironlb", Tag: "0.1.0", Version: "0.1.0",
		Revision: "0123456789abcdef0123456789abcdef01234567", Source: "https://github.com/ironlb/ironlb",
		Licenses: "Apache-2.0", Created: time.Unix(1795000000, 0).UTC(),
	}
}

func mustBuild(t *testing.T, s Spec) *Result {
	t.Helper()
	r, err := Build(s)
	if err != nil {
		t.Fatalf("Build: %v", err)
	}
	return r
}

func digest(t *testing.T, d interface{ Digest() (v1.Hash, error) }) v1.Hash {
	t.Helper()
	h, err := d.Digest()
	if err != nil {
		t.Fatal(err)
	}
	return h
}

func TestBuildIsReproducible(t *testing.T) {
	s := testSpec(t)
	a, b := mustBuild(t, s), mustBuild(t, s)
	if da, db := digest(t, a.Index), digest(t, b.Index); da != db {
		t.Fatalf("two builds of one spec: digests %s and %s", da, db)
	}
	// What is written is the same too, byte for byte.
	dirA, dirB := t.TempDir(), t.TempDir()
	wa, err := a.Write(dirA)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.Write(dirB); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"oci/index.json", "digest", "ironlb-linux-arm64.tar"} {
		ba, _ := os.ReadFile(filepath.Join(dirA, f))
		bb, _ := os.ReadFile(filepath.Join(dirB, f))
		if len(ba) == 0 || !bytes.Equal(ba, bb) {
			t.Errorf("%s differs between two builds (or is empty)", f)
		}
	}
	if got, _ := os.ReadFile(filepath.Join(dirA, "digest")); strings.TrimSpace(string(got)) != wa.Digest.String() {
		t.Errorf("digest file %q, want %s", got, wa.Digest)
	}
	// Writing the same image again leaves the directory alone; another image replaces it.
	if again, err := b.Write(dirA); err != nil || !again.Unchanged || wa.Unchanged {
		t.Errorf("rewriting one image: unchanged %v (first %v), %v", again.Unchanged, wa.Unchanged, err)
	}

	// Every input shows in the digest.
	for name, change := range map[string]func(*Spec){
		"created":  func(s *Spec) { s.Created = s.Created.Add(time.Second) },
		"revision": func(s *Spec) { s.Revision = "fedcba" },
		"binary": func(s *Spec) {
			f := filepath.Join(t.TempDir(), "other")
			if err := os.WriteFile(f, []byte("\x7fELF another"), 0o755); err != nil {
				t.Fatal(err)
			}
			s.Binaries = map[string]string{"linux/amd64": f, "linux/arm64": s.Binaries["linux/arm64"]}
		},
	} {
		s2 := testSpec(t)
		s2.Binaries = s.Binaries
		change(&s2)
		r2 := mustBuild(t, s2)
		if digest(t, r2.Index) == digest(t, a.Index) {
			t.Errorf("changing %s left the digest unchanged", name)
		}
		if name == "created" {
			w2, err := r2.Write(dirA)
			got, _ := os.ReadFile(filepath.Join(dirA, "digest"))
			if err != nil || w2.Unchanged || strings.TrimSpace(string(got)) != w2.Digest.String() {
				t.Errorf("writing another image over one: unchanged %v, digest file %q, %v", w2.Unchanged, got, err)
			}
		}
	}
}

func TestImageContents(t *testing.T) {
	s := testSpec(t)
	r := mustBuild(t, s)
	m, err := r.Index.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	if len(m.Manifests) != 2 || m.Manifests[0].Platform.String() != "linux/amd64" || m.Manifests[1].Platform.String() != "linux/arm64" {
		t.Fatalf("index manifests = %+v, want linux/amd64 and linux/arm64", m.Manifests)
	}
	if m.Annotations["org.opencontainers.image.revision"] != s.Revision {
		t.Errorf("index annotations = %v, want the revision", m.Annotations)
	}
	for _, p := range r.Platforms {
		img := r.Images[p]
		cf, err := img.ConfigFile()
		if err != nil {
			t.Fatal(err)
		}
		if cf.OS+"/"+cf.Architecture != p || !cf.Created.Equal(s.Created) {
			t.Errorf("%s: config os/arch %s/%s created %v", p, cf.OS, cf.Architecture, cf.Created)
		}
		c := cf.Config
		if strings.Join(c.Entrypoint, " ") != "/ironlb" || c.User != "65532:65532" || len(c.Cmd) != 0 {
			t.Errorf("%s: entrypoint %q cmd %q user %q", p, c.Entrypoint, c.Cmd, c.User)
		}
		for k, want := range map[string]string{
			"org.opencontainers.image.source":   s.Source,
			"org.opencontainers.image.revision": s.Revision,
			"org.opencontainers.image.version":  s.Version,
			"org.opencontainers.image.licenses": "Apache-2.0",
		} {
			if c.Labels[k] != want {
				t.Errorf("%s: label %s = %q, want %q", p, k, c.Labels[k], want)
			}
		}
		files := flatten(t, img)
		bin, _ := os.ReadFile(s.Binaries[p])
		for name, want := range map[string]struct {
			mode int64
			data string
		}{
			"etc/passwd": {0o644, "nonroot:x:65532:65532:"},
			"etc/group":  {0o644, "nonroot:x:65532:"},
			"tmp":        {0o1777, ""},
			"ironlb":     {0o755, string(bin)},
		} {
			f, ok := files[name]
			switch {
			case !ok:
				t.Errorf("%s: no %s in the image (have %v)", p, name, keys(files))
			case f.hdr.Mode != want.mode || f.hdr.Uid != 0 || !f.hdr.ModTime.Equal(s.Created):
				t.Errorf("%s: %s mode %o uid %d mtime %v", p, name, f.hdr.Mode, f.hdr.Uid, f.hdr.ModTime)
			case !strings.Contains(f.data, want.data):
				t.Errorf("%s: %s = %q, want it to contain %q", p, name, f.data, want.data)
			}
		}
	}
	// The base layer is shared by the platforms (pulled once for a mixed cluster).
	la, _ := r.Images["linux/amd64"].Layers()
	lb, _ := r.Images["linux/arm64"].Layers()
	if digest(t, la[0]) != digest(t, lb[0]) || digest(t, la[1]) == digest(t, lb[1]) {
		t.Error("want the base layer shared and the binary layers different")
	}

	// Written: the layout holds the index, the archives hold each platform's image.
	w, err := r.Write(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	idx, err := LoadIndex(w.Layout)
	if err != nil {
		t.Fatal(err)
	}
	if digest(t, idx) != w.Digest {
		t.Errorf("layout index %s, want %s", digest(t, idx), w.Digest)
	}
	for _, p := range r.Platforms {
		img, err := tarball.ImageFromPath(w.Archives[p], nil)
		if err != nil {
			t.Fatalf("%s archive: %v", p, err)
		}
		got, _ := img.ConfigName()
		want, _ := r.Images[p].ConfigName()
		if got != want {
			t.Errorf("%s archive config %s, want %s", p, got, want)
		}
	}
	sum, err := r.Summary(w)
	if err != nil || !strings.Contains(sum, "ghcr.io/ironlb/ironlb:0.1.0@"+w.Digest.String()) {
		t.Errorf("Summary = %q, %v", sum, err)
	}
}

type file struct {
	hdr  *tar.Header
	data string
}

func flatten(t *testing.T, img v1.Image) map[string]file {
	t.Helper()
	rc := mutate.Extract(img)
	defer func() { _ = rc.Close() }()
	tr := tar.NewReader(rc)
	out := map[string]file{}
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		data, _ := io.ReadAll(tr)
		out[h.Name] = file{h, string(data)}
	}
}

func keys(m map[string]file) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

func TestBuildErrors(t *testing.T) {
	notELF := filepath.Join(t.TempDir(), "script")
	if err := os.WriteFile(notELF, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	for name, tc := range map[string]struct {
		change func(*Spec)
		want   string
	}{
		"no revision":    {func(s *Spec) { s.Revision = "" }, "revision must not be empty"},
		"no binaries":    {func(s *Spec) { s.Binaries = nil }, "no binaries"},
		"no time":        {func(s *Spec) { s.Created = time.Time{} }, "no creation time"},
		"bad tag":        {func(s *Spec) { s.Tag = "a b" }, `tag "a b"`},
		"bad platform":   {func(s *Spec) { s.Binaries = map[string]string{"windows/amd64": notELF} }, `platform "windows/amd64"`},
		"missing binary": {func(s *Spec) { s.Binaries = map[string]string{"linux/amd64": "/no/such/ironlb"} }, "/no/such/ironlb"},
		"not ELF":        {func(s *Spec) { s.Binaries = map[string]string{"linux/amd64": notELF} }, "not an ELF executable"},
	} {
		s := testSpec(t)
		tc.change(&s)
		if _, err := Build(s); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: error %v, want one containing %q", name, err, tc.want)
		}
	}
	if err := run(t.Context(), []string{"build", "--binary", "linux/amd64"}); err == nil || !strings.Contains(err.Error(), "PLATFORM=PATH") {
		t.Errorf("--binary without a path: %v", err)
	}
	if err := run(t.Context(), []string{"build", "--epoch", "yesterday"}); err == nil || !strings.Contains(err.Error(), `--epoch "yesterday"`) {
		t.Errorf("bad --epoch: %v", err)
	}
}
