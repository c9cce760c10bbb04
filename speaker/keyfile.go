package speaker

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/go-logr/logr"
)

// keyReloadInterval is how often the mounted memberlist key file is re-read.
// The kubelet updates a mounted Secret in place (an atomic symlink swap) within
// its sync period, about a minute; 10 s adds little to that and costs one small
// read.
const keyReloadInterval = 10 * time.Second

// keyFilePath returns the key file for MLSecretKeyPath: the secretkey file
// inside it when it is a directory (the Secret volume), else the path itself.
func keyFilePath(p string) string {
	if st, err := os.Stat(p); err == nil && st.IsDir() {
		return filepath.Join(p, SecretKeyField)
	}
	return p
}

// readKeyFile reads the memberlist key; an empty file is an error (it would
// silently disable rotation or encryption).
func readKeyFile(path string) ([]byte, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read memberlist secret key %s: %w", path, err)
	}
	if len(b) == 0 {
		return nil, fmt.Errorf("read memberlist secret key %s: %w", path, errors.New("file is empty"))
	}
	return b, nil
}

// A rotation has three phases on every speaker (docs/security.md): the new
// key is installed at once (accepted, not used), used to send keyUseAfter
// later, and the previous keys are retired keyRetireAfter after that.
//
// keyUseAfter must exceed the skew between speakers loading the rotated
// Secret, so that every speaker accepts the new key before any sends with
// it: the kubelet refreshes a mounted Secret within its sync period plus its
// cache TTL (one minute each by default), and keyReloadInterval adds 10 s.
// keyRetireAfter must exceed the same skew, so that every speaker sends with
// the new key before any stops accepting the old one. A leaked key stops
// working keyUseAfter+keyRetireAfter after the rotation reached the nodes.
const (
	keyUseAfter    = 3 * time.Minute
	keyRetireAfter = 3 * time.Minute
)

// keyring is the part of *membership.List the key watcher drives.
type keyring interface {
	InstallKey(secret []byte) error
	UseKey(secret []byte) error
	RetireOldKeys() (int, error)
}

// watchKeyFile re-reads the key file every interval until ctx ends and rotates kr
// to its content when it differs from the key last loaded (current at start):
// that is how a rotated Secret reaches memberlist without API access to Secrets.
// The new key is installed at once, used keyUseAfter later, and the previous
// keys are retired keyRetireAfter after that; a newer file restarts the
// sequence with its key. A missing or empty file keeps the current key; each
// distinct failure is logged once.
func watchKeyFile(ctx context.Context, log logr.Logger, path string, interval time.Duration, current []byte, kr keyring) {
	watchKeyFileRotating(ctx, log, path, interval, keyUseAfter, keyRetireAfter, current, kr)
}

func watchKeyFileRotating(ctx context.Context, log logr.Logger, path string, interval, useAfter, retireAfter time.Duration, current []byte, kr keyring) {
	t := time.NewTicker(interval)
	defer t.Stop()
	// use fires useAfter after a new key was installed, retire retireAfter
	// after it was used; nil while nothing is pending.
	var use, retire <-chan time.Time
	lastErr := ""
	report := func(err error) {
		if err == nil {
			lastErr = ""
			return
		}
		if msg := err.Error(); msg != lastErr {
			lastErr = msg
			log.Error(err, "keeping the current memberlist key", "path", path)
		}
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-use:
			use = nil
			if err := kr.UseKey(current); err != nil {
				log.Error(err, "cannot send with the new memberlist key; retrying at the next check")
				use = time.After(interval)
				continue
			}
			retire = time.After(retireAfter)
			log.Info("sending with the new memberlist key; previous keys accepted until retired", "retireAfter", retireAfter)
			continue
		case <-retire:
			retire = nil
			if _, err := kr.RetireOldKeys(); err != nil {
				log.Error(err, "cannot retire the previous memberlist keys; retrying at the next check")
				retire = time.After(interval)
			}
			continue
		case <-t.C:
		}
		b, err := readKeyFile(path)
		if err != nil {
			report(err)
			continue
		}
		if bytes.Equal(b, current) {
			report(nil)
			continue
		}
		if err := kr.InstallKey(b); err != nil {
			report(fmt.Errorf("install memberlist key from %s: %w", path, err))
			continue
		}
		report(nil)
		current = b
		use, retire = time.After(useAfter), nil
		log.Info("memberlist key file changed; new key accepted now, used to send once every speaker has had time to load it", "path", path, "useAfter", useAfter)
	}
}
