package main

import (
	"context"
	"io"
	"log"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
)

// TestPush pushes a built layout to an in-process registry (loopback only) and pulls it
// back: the same index digest, and each platform resolves to its image.
func TestPush(t *testing.T) {
	r := mustBuild(t, testSpec(t))
	w, err := r.Write(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	defer srv.Close()
	host := strings.TrimPrefix(srv.URL, "http://")
	ref := host + "/ironlb/ironlb:0.1.0"
	d, err := Push(t.Context(), w.Layout, ref)
	if err != nil {
		t.Fatalf("Push: %v", err)
	}
	if d != w.Digest {
		t.Errorf("pushed digest %s, want %s", d, w.Digest)
	}
	tag, _ := name.ParseReference(ref)
	desc, err := remote.Get(tag)
	if err != nil {
		t.Fatal(err)
	}
	if desc.Digest != w.Digest {
		t.Errorf("registry has %s, want %s", desc.Digest, w.Digest)
	}
	img, err := remote.Image(tag, remote.WithPlatform(v1.Platform{OS: "linux", Architecture: "arm64"}))
	if err != nil {
		t.Fatal(err)
	}
	if digest(t, img) != digest(t, r.Images["linux/arm64"]) {
		t.Error("linux/arm64 from the registry differs from the built one")
	}
	if _, err := Push(t.Context(), t.TempDir(), ref); err == nil {
		t.Error("pushing an empty directory: want an error")
	}
}

// The dry run's registry: loopback only, and a push to it reads back.
func TestServeRegistry(t *testing.T) {
	if err := ServeRegistry(t.Context(), "0.0.0.0:0", func(string) error { return nil }); err == nil || !strings.Contains(err.Error(), "loopback") {
		t.Errorf("a non-loopback address: %v", err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	addrCh, done := make(chan string, 1), make(chan error, 1)
	go func() {
		done <- ServeRegistry(ctx, "127.0.0.1:0", func(a string) error { addrCh <- a; return nil })
	}()
	var addr string
	select {
	case addr = <-addrCh:
	case err := <-done:
		t.Fatalf("ServeRegistry: %v", err)
	}
	w, err := mustBuild(t, testSpec(t)).Write(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if d, err := Push(ctx, w.Layout, addr+"/ironlb/ironlb:0.1.0"); err != nil || d != w.Digest {
		t.Errorf("Push to the dry-run registry: %s, %v", d, err)
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("ServeRegistry after cancel: %v", err)
	}
}
