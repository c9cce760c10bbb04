package ownership

import (
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
	return HashLess(a.Owner, b.Owner, a.Key)
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
	return pack(wireVersion, claims, AppendClaim, maxBytes)
}

// pack encodes items as messages of at most maxBytes each, each starting
// with version, in order, as few as fit; an item that does not fit maxBytes
// on its own gets a message of its own.
func pack[T any](version byte, items []T, appendOne func([]byte, T) []byte, maxBytes int) [][]byte {
	var out [][]byte
	var msg []byte
	for _, it := range items {
		one := appendOne(nil, it)
		if len(msg) > 0 && len(msg)+len(one) > maxBytes {
			out = append(out, msg)
			msg = nil
		}
		if len(msg) == 0 {
			msg = []byte{version}
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

// Wire format of a votes message (a watcher's findings, sent to every member
// when one changes and re-sent as gossip; or a replica's votes in its state):
//
//	byte    version (3)
//	repeated until the end:
//	  uvarint seq, byte path, uvarint len(node), node, uvarint len(watcher), watcher
//
// path is a Path: 0 unknown, 1 up, 2 down, 3 unhealthy (added with health
// checks; a speaker of an earlier release refuses a message carrying it,
// which during a rolling update costs it those votes until it is updated).
//
// Version 2, a verdict without its watcher or sequence, was a command any
// member could give about any node; it is no longer accepted.
const votesVersion = 3

// IsVotes reports whether a message is a votes message (else claims).
func IsVotes(b []byte) bool { return len(b) > 0 && b[0] == votesVersion }

// AppendVote appends one vote (without the version byte) to buf.
func AppendVote(buf []byte, v Vote) []byte {
	buf = binary.AppendUvarint(buf, v.Seq)
	buf = append(buf, byte(v.Path))
	buf = binary.AppendUvarint(buf, uint64(len(v.Node)))
	buf = append(buf, v.Node...)
	buf = binary.AppendUvarint(buf, uint64(len(v.Watcher)))
	return append(buf, v.Watcher...)
}

// PackVotes encodes votes as messages of at most maxBytes each (a vote that
// does not fit alone gets a message of its own).
func PackVotes(votes []Vote, maxBytes int) [][]byte {
	return pack(votesVersion, votes, AppendVote, maxBytes)
}

// DecodeVotes parses a votes message. It never panics; a message that does
// not parse as a whole yields no votes and an error wrapping ErrBadMessage.
func DecodeVotes(b []byte) ([]Vote, error) {
	if len(b) == 0 || b[0] != votesVersion {
		return nil, fmt.Errorf("%w: not a votes message", ErrBadMessage)
	}
	b = b[1:]
	var out []Vote
	for len(b) > 0 {
		var v Vote
		var n int
		v.Seq, n = binary.Uvarint(b)
		if n <= 0 || len(b) < n+1 {
			return nil, fmt.Errorf("%w: seq of vote %d", ErrBadMessage, len(out))
		}
		v.Path = Path(b[n])
		if v.Path > PathUnhealthy {
			return nil, fmt.Errorf("%w: path %d of vote %d", ErrBadMessage, b[n], len(out))
		}
		b = b[n+1:]
		var err error
		if v.Node, b, err = readString(b); err != nil {
			return nil, fmt.Errorf("%w: node of vote %d: %w", ErrBadMessage, len(out), err)
		}
		if v.Watcher, b, err = readString(b); err != nil {
			return nil, fmt.Errorf("%w: watcher of vote %d: %w", ErrBadMessage, len(out), err)
		}
		if v.Node == "" || v.Watcher == "" {
			return nil, fmt.Errorf("%w: vote %d has an empty node or watcher", ErrBadMessage, len(out))
		}
		out = append(out, v)
	}
	return out, nil
}

// Wire format of a replica's state (memberlist push/pull):
//
//	byte    version (4)
//	uvarint len(claims), claims message (version 1)
//	votes message (version 3), or nothing
//
// A version-1 claims message alone is accepted as a state too (a speaker of
// the previous release).
const stateVersion = 4

// AppendState appends the wire form of a replica's claims and votes.
func AppendState(buf []byte, claims []Claim, votes []Vote) []byte {
	c := AppendClaims(nil, claims...)
	buf = append(buf, stateVersion)
	buf = binary.AppendUvarint(buf, uint64(len(c)))
	buf = append(buf, c...)
	if len(votes) > 0 {
		buf = append(buf, votesVersion)
		for _, v := range votes {
			buf = AppendVote(buf, v)
		}
	}
	return buf
}

// DecodeState parses a replica's state, wrapping ErrBadMessage on failure.
func DecodeState(b []byte) ([]Claim, []Vote, error) {
	if len(b) > 0 && b[0] == wireVersion {
		c, err := DecodeClaims(b)
		return c, nil, err
	}
	if len(b) == 0 || b[0] != stateVersion {
		return nil, nil, fmt.Errorf("%w: not a state message", ErrBadMessage)
	}
	l, n := binary.Uvarint(b[1:])
	if n <= 0 || l > uint64(len(b)-1-n) {
		return nil, nil, fmt.Errorf("%w: claims length", ErrBadMessage)
	}
	rest := b[1+n:]
	claims, err := DecodeClaims(rest[:l])
	if err != nil {
		return nil, nil, err
	}
	if len(rest[l:]) == 0 {
		return claims, nil, nil
	}
	votes, err := DecodeVotes(rest[l:])
	if err != nil {
		return nil, nil, err
	}
	return claims, votes, nil
}
