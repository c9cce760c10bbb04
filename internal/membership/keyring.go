package membership

import (
	"bytes"
	"errors"
	"fmt"
)

// RetireOldKeys removes every key but the primary from the keyring and returns how
// many it removed. SetSecretKey keeps the previous keys so that members which have
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
