package membership

import (
	"crypto/sha256"
	"slices"
	"time"
)

// SetMeta sets what this member says of itself to the others (memberlist's
// node metadata, carried by the application delegate: only with
// Options.State) and spreads it: they see it in MemberState.Meta within a
// gossip round or two. Beside it the metadata carries the fingerprints of
// the keys this member accepts (MemberState.Keys), which a key rotation
// waits for; len(meta) must stay under maxAppMeta.
func (l *List) SetMeta(meta []byte) {
	m := slices.Clone(meta)
	l.meta.Store(&m)
	l.spreadMeta()
}

// spreadMeta gossips this member's metadata again: after SetMeta and after
// every change of the keyring.
func (l *List) spreadMeta() {
	if l.ml == nil {
		return
	}
	go func() {
		if err := l.ml.UpdateNode(5 * time.Second); err != nil {
			l.log.V(1).Info("spreading this member's metadata", "error", err.Error())
		}
	}()
}

// Fingerprint names a memberlist key without revealing it: the first 8
// bytes of a SHA-256 over a label and the AES key. Members publish the
// fingerprints of the keys they accept, so that a rotation sends with a new
// key only once every member accepts it.
type Fingerprint [8]byte

// KeyFingerprint returns the fingerprint of the key derived from a Secret's
// data (SecretKeyFromSecret).
func KeyFingerprint(secret []byte) Fingerprint {
	return fingerprintOf(SecretKeyFromSecret(secret))
}

func fingerprintOf(aesKey []byte) Fingerprint {
	h := sha256.New()
	h.Write([]byte("ironlb memberlist key fingerprint\x00"))
	h.Write(aesKey)
	var fp Fingerprint
	copy(fp[:], h.Sum(nil))
	return fp
}

// The metadata on the wire is
//
//	[len(app)] [app ...] [n] [fingerprint 8 bytes] * n
//
// with the key this member sends with first. A speaker of the previous
// release sent the application's byte alone; decodeMeta reads anything it
// cannot parse that way, as the application's metadata with no keys known.
// (That release reads the first byte as "answers for its IPs": non-zero
// here, the default it assumes anyway.)
const (
	// maxAppMeta bounds the application's part.
	maxAppMeta = 64
	// maxMetaKeys bounds the fingerprints sent and read: a rotation
	// rarely holds more than two or three keys; a hostile or corrupt
	// peer's list is cut here.
	maxMetaKeys = 16
)

// encodeMeta lays out app and keys within limit bytes, dropping the keys
// that do not fit (the first, the key in use, is kept if any is).
func encodeMeta(app []byte, keys []Fingerprint, limit int) []byte {
	if len(app) > maxAppMeta {
		app = app[:maxAppMeta]
	}
	keys = keys[:min(len(keys), maxMetaKeys, max(0, (limit-2-len(app))/len(Fingerprint{})))]
	out := make([]byte, 0, 2+len(app)+len(keys)*len(Fingerprint{}))
	out = append(out, byte(len(app)))
	out = append(out, app...)
	out = append(out, byte(len(keys)))
	for _, k := range keys {
		out = append(out, k[:]...)
	}
	return out
}

// decodeMeta splits metadata into the application's part and the key
// fingerprints. Metadata that is not in this format (a previous release,
// or garbage) is all the application's, with no keys.
func decodeMeta(b []byte) (app []byte, keys []Fingerprint) {
	if len(b) < 2 {
		return b, nil
	}
	n := int(b[0])
	if n > maxAppMeta || len(b) < 1+n+1 {
		return b, nil
	}
	app, rest := b[1:1+n], b[1+n:]
	k := int(rest[0])
	rest = rest[1:]
	if k > maxMetaKeys || len(rest) != k*len(Fingerprint{}) {
		return b, nil
	}
	keys = make([]Fingerprint, k)
	for i := range keys {
		copy(keys[i][:], rest[i*len(Fingerprint{}):])
	}
	return app, keys
}

// localKeys returns the fingerprints of the keys this member accepts, the
// one it sends with first (memberlist keeps it first); nil without
// encryption.
func (l *List) localKeys() []Fingerprint {
	if l.keyring == nil {
		return nil
	}
	ks := l.keyring.GetKeys()
	out := make([]Fingerprint, 0, len(ks))
	for _, k := range ks {
		out = append(out, fingerprintOf(k))
	}
	return out
}

// MembersLackingKey returns the speakers that are not known to accept the
// key of secret: members (alive or suspect) that do not say they accept it
// (they have not installed it yet, or run a release that does not say),
// and the addresses of peers (SetPeers: every speaker Pod) that are not
// members now, whose keys nobody can tell: a speaker cut off for a while
// may not have loaded the rotated Secret, and would not read the others if
// they sent with a key it lacks. Empty when every speaker accepts it:
// sending with that key then cuts nobody off.
func (l *List) MembersLackingKey(secret []byte) []string {
	want := KeyFingerprint(secret)
	var lacking []string
	for _, m := range l.States() {
		if m.Name != l.opts.NodeName && !slices.Contains(m.Keys, want) {
			lacking = append(lacking, m.Name)
		}
	}
	for _, p := range l.absentPeers() {
		lacking = append(lacking, p+" (not a member now)")
	}
	return lacking
}
