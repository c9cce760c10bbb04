package ownership

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
)

// Claim records who owns a key. It is the unit of replication.
type Claim struct {
	// Key is the Service's key IP in canonical form (netip.Addr.String()).
	Key string
	// Owner is the node that announces the key's IPs.
	Owner string
	// Epoch counts the transitions of this key; each one adds one.
	Epoch uint64
}

// Newer reports whether a supersedes b (both for the same key): the higher
// epoch wins; at equal epochs the smaller sha256(owner#key) wins, then the
// smaller owner name. It is a strict total order on claims of one key, so
// merging replicas in any order gives the same result.
func Newer(a, b Claim) bool {
	if a.Epoch != b.Epoch {
		return a.Epoch > b.Epoch
	}
	if a.Owner == b.Owner {
		return false
	}
	ha, hb := Hash(a.Owner, a.Key), Hash(b.Owner, b.Key)
	if c := bytes.Compare(ha[:], hb[:]); c != 0 {
		return c < 0
	}
	return a.Owner < b.Owner
}

// Hash is the election hash of node for key, sha256(node + "#" + key):
// MetalLB's layer-2 rule, so the hash winner is the node MetalLB would pick.
func Hash(node, key string) [sha256.Size]byte {
	// A stack buffer instead of node+"#"+key: the election hashes every
	// candidate of every key it re-places, and the concatenation was its
	// only allocation.
	var buf [320]byte
	b := append(append(append(buf[:0], node...), '#'), key...)
	return sha256.Sum256(b)
}

// Wire format of a claims message (gossip broadcast or push/pull state):
//
//	byte    version (1)
//	repeated until the end:
//	  uvarint epoch, uvarint len(key), key, uvarint len(owner), owner
//
// Compact (a claim is ~30 bytes, ~40 fit in one memberlist packet) and
// versioned so a later format can be told apart.
const wireVersion = 1

// maxNameLen bounds keys (an IPv6 address is at most 45 bytes) and owners (a
// Kubernetes node name is at most 253): a longer field is a corrupt message.
const maxNameLen = 253

// ErrBadMessage wraps every decoding failure.
var ErrBadMessage = errors.New("ownership: bad claims message")

// AppendClaims appends the wire form of claims to buf.
func AppendClaims(buf []byte, claims ...Claim) []byte {
	if len(buf) == 0 {
		buf = append(buf, wireVersion)
	}
	for _, c := range claims {
		buf = AppendClaim(buf, c)
	}
	return buf
}

// PackClaims encodes claims as messages of at most maxBytes each, in order,
// as few as fit: a takeover's claims go out as a few dozen gossip messages
// instead of one per claim (each received message costs a slot in
// memberlist's handler queue, which drops what overflows). A claim that does
// not fit maxBytes on its own gets a message of its own.
func PackClaims(claims []Claim, maxBytes int) [][]byte {
	var out [][]byte
	var msg []byte
	for _, c := range claims {
		one := AppendClaim(nil, c)
		if len(msg) > 0 && len(msg)+len(one) > maxBytes {
			out = append(out, msg)
			msg = nil
		}
		if len(msg) == 0 {
			msg = []byte{wireVersion}
		}
		msg = append(msg, one...)
	}
	if len(msg) > 0 {
		out = append(out, msg)
	}
	return out
}

// AppendClaim appends one claim (without the version byte) to buf.
func AppendClaim(buf []byte, c Claim) []byte {
	buf = binary.AppendUvarint(buf, c.Epoch)
	buf = binary.AppendUvarint(buf, uint64(len(c.Key)))
	buf = append(buf, c.Key...)
	buf = binary.AppendUvarint(buf, uint64(len(c.Owner)))
	return append(buf, c.Owner...)
}

// DecodeClaims parses a claims message. It never panics on any input; a
// message that does not parse as a whole yields no claims and an error
// wrapping ErrBadMessage.
func DecodeClaims(b []byte) ([]Claim, error) {
	if len(b) == 0 {
		return nil, fmt.Errorf("%w: empty", ErrBadMessage)
	}
	if b[0] != wireVersion {
		return nil, fmt.Errorf("%w: version %d, want %d", ErrBadMessage, b[0], wireVersion)
	}
	b = b[1:]
	var out []Claim
	for len(b) > 0 {
		var c Claim
		var n int
		c.Epoch, n = binary.Uvarint(b)
		if n <= 0 {
			return nil, fmt.Errorf("%w: epoch of claim %d", ErrBadMessage, len(out))
		}
		b = b[n:]
		var err error
		if c.Key, b, err = readString(b); err != nil {
			return nil, fmt.Errorf("%w: key of claim %d: %w", ErrBadMessage, len(out), err)
		}
		if c.Owner, b, err = readString(b); err != nil {
			return nil, fmt.Errorf("%w: owner of claim %d: %w", ErrBadMessage, len(out), err)
		}
		if c.Key == "" || c.Owner == "" {
			return nil, fmt.Errorf("%w: claim %d has an empty key or owner", ErrBadMessage, len(out))
		}
		out = append(out, c)
	}
	return out, nil
}

func readString(b []byte) (string, []byte, error) {
	l, n := binary.Uvarint(b)
	if n <= 0 {
		return "", nil, errors.New("bad length")
	}
	if l > maxNameLen || l > uint64(len(b)-n) {
		return "", nil, fmt.Errorf("length %d out of range", l)
	}
	return string(b[n : n+int(l)]), b[n+int(l):], nil
}

// Verdict is a watcher's finding on a node's data path. Watchers send it to
// every member (memberlist's encrypted transport), so that the nodes that
// take over the node's keys act on it without probing the node themselves.
type Verdict struct {
	Node string
	Path Path
}

// Wire format of a verdict message:
//
//	byte version (2), byte path, node
const verdictVersion = 2

// IsVerdict reports whether a message is a verdict (else claims).
func IsVerdict(b []byte) bool { return len(b) > 0 && b[0] == verdictVersion }

// AppendVerdict appends the wire form of v to buf.
func AppendVerdict(buf []byte, v Verdict) []byte {
	return append(append(buf, verdictVersion, byte(v.Path)), v.Node...)
}

// DecodeVerdict parses a verdict message, wrapping ErrBadMessage on failure.
func DecodeVerdict(b []byte) (Verdict, error) {
	switch {
	case len(b) < 3:
		return Verdict{}, fmt.Errorf("%w: verdict of %d bytes", ErrBadMessage, len(b))
	case b[0] != verdictVersion:
		return Verdict{}, fmt.Errorf("%w: version %d, want %d", ErrBadMessage, b[0], verdictVersion)
	case Path(b[1]) > PathDown:
		return Verdict{}, fmt.Errorf("%w: path %d", ErrBadMessage, b[1])
	case len(b)-2 > maxNameLen:
		return Verdict{}, fmt.Errorf("%w: node name of %d bytes", ErrBadMessage, len(b)-2)
	}
	return Verdict{Node: string(b[2:]), Path: Path(b[1])}, nil
}
