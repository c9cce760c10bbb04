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
// key is installed at once (accepted, not used); it is used to send as soon
// as every speaker says it accepts it too (membership.MembersLackingKey,
// checked every keyAgreeInterval: every member, and every speaker Pod that
// is not a member now, which cannot say), and keyUseAfter after the install
// at the latest; the previous keys are retired keyRetireAfter after the
// switch.
//
// Waiting for the speakers' word is what lets a speaker restarted during a
// rotation, which knows only the key in the file and sends with it, read
// the others within seconds rather than minutes: they all accept its key,
// so they switch to it. keyUseAfter only bounds the wait for a member that
// never says (a previous release, or one whose Secret never updates): it
// must exceed the skew between speakers loading the rotated Secret (the
// kubelet refreshes a mounted Secret within its sync period plus its cache
// TTL, one minute each by default, and keyReloadInterval adds 10 s).
// keyRetireAfter must exceed the same skew, so that every speaker sends with
// the new key before any stops accepting the old one. A leaked key stops
// working keyUseAfter+keyRetireAfter after the rotation reached the nodes at
// the latest.
const (
	keyUseAfter      = 3 * time.Minute
	keyRetireAfter   = 3 * time.Minute
	keyAgreeInterval = time.Second
)

// keyring is the part of *membership.List the key watcher drives.
type keyring interface {
	InstallKey(secret []byte) error
	UseKey(secret []byte) error
	RetireOldKeys() (int, error)
	MembersLackingKey(secret []byte) []string
}

// keyTimings are a rotation's waits (the constants above; tests shorten them).
type keyTimings struct {
	reload, agree, useAfter, retireAfter time.Duration
}

// watchKeyFile re-reads the key file every keyReloadInterval until ctx ends
// and rotates kr to its content when it differs from the key last loaded
// (current at start): that is how a rotated Secret reaches memberlist
// without API access to Secrets. The new key is installed at once, used once
// every speaker accepts it (keyUseAfter at the latest), and the previous
// keys are retired keyRetireAfter after that; a newer file restarts the
// sequence with its key. A missing or empty file keeps the current key;
// each distinct failure is logged once.
func watchKeyFile(ctx context.Context, log logr.Logger, path string, current []byte, kr keyring) {
	watchKeyFileTimed(ctx, log, path, keyTimings{keyReloadInterval, keyAgreeInterval, keyUseAfter, keyRetireAfter}, current, kr)
}

func watchKeyFileTimed(ctx context.Context, log logr.Logger, path string, tm keyTimings, current []byte, kr keyring) {
	reload := time.NewTicker(tm.reload)
	defer reload.Stop()
	agree := time.NewTicker(tm.agree)
	defer agree.Stop()
	// useBy is non-nil while a new key is installed and not used yet, and
	// fires when it is used whatever the speakers say; retire fires
	// retireAfter after the switch. Each is nil while nothing is pending.
	var useBy, retire <-chan time.Time
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
	use := func(lacking []string) {
		if err := kr.UseKey(current); err != nil {
			log.Error(err, "cannot send with the new memberlist key; retrying at the next check")
			useBy = time.After(tm.reload)
			return
		}
		useBy, retire = nil, time.After(tm.retireAfter)
		if len(lacking) > 0 {
			log.Info("sending with the new memberlist key although these speakers have not said they accept it; they cannot read this speaker until they load it",
				"speakers", lacking, "waited", tm.useAfter, "retireAfter", tm.retireAfter)
			return
		}
		log.Info("sending with the new memberlist key: every speaker accepts it; previous keys accepted until retired", "retireAfter", tm.retireAfter)
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-agree.C:
			if useBy != nil && len(kr.MembersLackingKey(current)) == 0 {
				use(nil)
			}
			continue
		case <-useBy:
			use(kr.MembersLackingKey(current))
			continue
		case <-retire:
			retire = nil
			if _, err := kr.RetireOldKeys(); err != nil {
				log.Error(err, "cannot retire the previous memberlist keys; retrying at the next check")
				retire = time.After(tm.reload)
			}
			continue
		case <-reload.C:
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
		useBy, retire = time.After(tm.useAfter), nil
		log.Info("memberlist key file changed; new key accepted now, used to send once every speaker accepts it", "path", path, "useAfterAtLatest", tm.useAfter)
	}
}
