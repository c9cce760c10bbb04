package membership

import (
	"bytes"
	"errors"
	"fmt"
)

// RetireOldKeys removes every key but the primary from the keyring and returns how
// many it removed. A rotation (InstallKey, UseKey) keeps the previous keys so that members which have
// not switched yet are still understood; once every member has had time to load the
// rotated Secret, the old keys must go, or a leaked key keeps decrypting and
// forging memberlist traffic for as long as the speakers run. A member still on a
// retired key can no longer talk to the others (it is seen as failed).
func (l *List) RetireOldKeys() (int, error) {
	if l.keyring == nil {
		return 0, errors.New("memberlist was started without encryption")
	}
	primary := l.keyring.GetPrimaryKey()
	removed := 0
	for _, k := range l.keyring.GetKeys() {
		if bytes.Equal(k, primary) {
			continue
		}
		if err := l.keyring.RemoveKey(k); err != nil {
			return removed, fmt.Errorf("remove memberlist key: %w", err)
		}
		removed++
	}
	if removed > 0 {
		l.spreadMeta()
		l.log.Info("retired old memberlist keys", "removed", removed, "keys", len(l.keyring.GetKeys()))
	}
	return removed, nil
}

// NumKeys returns how many keys memberlist accepts (0 without encryption): 1 in
// steady state, more between a rotation and RetireOldKeys.
func (l *List) NumKeys() int {
	if l.keyring == nil {
		return 0
	}
	return len(l.keyring.GetKeys())
}

// InstallKey makes memberlist accept secret's key without sending with it:
// the first phase of a rotation. Every member installs the new key before
// any member sends with it (UseKey), so a rotation never splits the members
// into those that have the new key and those that cannot read it: each
// member publishes the fingerprints of the keys it accepts, and
// MembersLackingKey tells when all have it.
func (l *List) InstallKey(secret []byte) error {
	if l.keyring == nil {
		return errors.New("memberlist was started without encryption; restart to enable it")
	}
	k := SecretKeyFromSecret(secret)
	if len(k) == 0 {
		return errors.New("empty memberlist secret key")
	}
	for _, have := range l.keyring.GetKeys() {
		if bytes.Equal(have, k) {
			return nil
		}
	}
	if err := l.keyring.AddKey(k); err != nil {
		return fmt.Errorf("add memberlist key: %w", err)
	}
	l.spreadMeta() // the others wait for every member to accept it
	l.log.Info("memberlist key installed: accepted, not yet used to send", "keys", len(l.keyring.GetKeys()))
	return nil
}

// UseKey sends with secret's key from now on (installing it if needed): the
// second phase of a rotation.
func (l *List) UseKey(secret []byte) error {
	if err := l.InstallKey(secret); err != nil {
		return err
	}
	k := SecretKeyFromSecret(secret)
	if bytes.Equal(l.keyring.GetPrimaryKey(), k) {
		return nil
	}
	if err := l.keyring.UseKey(k); err != nil {
		return fmt.Errorf("use memberlist key: %w", err)
	}
	l.spreadMeta()
	l.log.Info("memberlist key rotated: sending with the new key", "keys", len(l.keyring.GetKeys()))
	return nil
}
