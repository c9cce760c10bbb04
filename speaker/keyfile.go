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

// keyRetireAfter is how long the keys in use before a rotation keep being accepted
// after this speaker switched to the new one. Every speaker must have switched by
// then: the kubelet refreshes a mounted Secret within its sync period plus its
// cache TTL (one minute each by default), and keyReloadInterval adds 10 s. A
// speaker still on the old key after that is cut off from the others, so the
// margin is generous; a leaked key stops working this long after the rotation
// reached the nodes (docs/security.md).
const keyRetireAfter = 5 * time.Minute

// keyring is the part of *membership.List the key watcher drives.
type keyring interface {
	SetSecretKey(secret []byte) error
	RetireOldKeys() (int, error)
}

// watchKeyFile re-reads the key file every interval until ctx ends and switches kr
// to its content when it differs from the key last applied (current at start):
// that is how a rotated Secret reaches memberlist without API access to Secrets.
// keyRetireAfter after the last switch, the previous keys are retired. A missing
// or empty file keeps the current key; each distinct failure is logged once.
func watchKeyFile(ctx context.Context, log logr.Logger, path string, interval time.Duration, current []byte, kr keyring) {
	watchKeyFileRetiring(ctx, log, path, interval, keyRetireAfter, current, kr)
}

func watchKeyFileRetiring(ctx context.Context, log logr.Logger, path string, interval, retireAfter time.Duration, current []byte, kr keyring) {
	t := time.NewTicker(interval)
	defer t.Stop()
	// retire fires retireAfter after the last switch; nil while nothing is pending.
	var retire <-chan time.Time
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
		if err := kr.SetSecretKey(b); err != nil {
			report(fmt.Errorf("apply memberlist key from %s: %w", path, err))
			continue
		}
		report(nil)
		current = b
		retire = time.After(retireAfter)
		log.Info("memberlist key file changed; new key in use, previous keys accepted until retired", "path", path, "retireAfter", retireAfter)
	}
}
