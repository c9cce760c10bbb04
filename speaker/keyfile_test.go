package speaker

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/go-logr/logr"

	"github.com/ironlb/ironlb/internal/membership"
)

// A rotated key file (the kubelet swapping the mounted Secret) reaches the
// running memberlist in three phases: installed (accepted, not used), used,
// and the previous key retired; a missing or empty file keeps the current
// key.
func TestKeyFileReload(t *testing.T) {
	dir := t.TempDir()
	path := keyFilePath(dir)
	if path != filepath.Join(dir, SecretKeyField) {
		t.Fatalf("keyFilePath(dir) = %s, want the secretkey file inside", path)
	}
	write := func(s string) {
		t.Helper()
		// Like the kubelet: a new file renamed over the old one.
		tmp := filepath.Join(dir, ".tmp")
		if err := os.WriteFile(tmp, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, path); err != nil {
			t.Fatal(err)
		}
	}
	write("first key")
	key, err := readKeyFile(path)
	if err != nil {
		t.Fatal(err)
	}

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	o := membership.DefaultOptions()
	o.NodeName, o.BindAddr, o.BindPort, o.SecretKey = "solo", "127.0.0.1", freeUDPTCPPort(t, "127.0.0.1"), key
	l, err := membership.Start(ctx, logr.Discard(), o)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		watchKeyFileRotating(ctx, logr.Discard(), path, 20*time.Millisecond, time.Second, 2*time.Second, key, l)
	}()

	waitKey := func(want string) {
		t.Helper()
		wantKey := membership.SecretKeyFromSecret([]byte(want))
		for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
			if bytes.Equal(l.PrimaryKey(), wantKey) {
				return
			}
		}
		t.Fatalf("primary key %x, want the key of %q (%x)", l.PrimaryKey(), want, wantKey)
	}
	waitKey("first key")
	write("second key")
	// First the new key is accepted while the old one still encrypts (peers
	// that have not loaded the Secret yet must still read this speaker)...
	for deadline := time.Now().Add(30 * time.Second); l.NumKeys() != 2; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d keys accepted 30s after the key file changed, want 2 (old and new)", l.NumKeys())
		}
	}
	if want := membership.SecretKeyFromSecret([]byte("first key")); !bytes.Equal(l.PrimaryKey(), want) {
		t.Fatalf("the new key was used to send as soon as it was installed")
	}
	// ...then it is used...
	waitKey("second key")
	// ...and the first key is accepted for a while (peers that have not
	// switched yet), then retired: a leaked old key stops working.
	if n := l.NumKeys(); n != 2 {
		t.Errorf("right after the switch %d keys are accepted, want 2 (old and new)", n)
	}
	for deadline := time.Now().Add(30 * time.Second); l.NumKeys() != 1; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d keys still accepted 30s after the rotation, want the old one retired", l.NumKeys())
		}
	}

	// Empty, then missing: the key in use stays; the next good file applies.
	write("")
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	write("third key")
	waitKey("third key")

	cancel()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("watchKeyFile did not stop with its context")
	}
	<-l.Done()
}

func TestReadKeyFileEmpty(t *testing.T) {
	p := filepath.Join(t.TempDir(), SecretKeyField)
	if err := os.WriteFile(p, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := readKeyFile(p); err == nil {
		t.Fatal("an empty key file was accepted")
	}
}
