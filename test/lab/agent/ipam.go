package agent

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"sync"
)

// IPAM hands out pod addresses from one of the node's pod CIDRs, starting at .2
// (::2; .1 is left for the node, the network and IPv4 broadcast addresses are
// never used).
// Allocations are keyed by pod UID and persisted in a JSON file so that an
// agent restart keeps every pod's address.
type IPAM struct {
	mu     sync.Mutex
	prefix netip.Prefix
	path   string
	byKey  map[string]netip.Addr
}

type ipamFile struct {
	CIDR        string            `json:"cidr"`
	Allocations map[string]string `json:"allocations"`
}

// ErrPoolExhausted means every address of the pod CIDR is in use.
var ErrPoolExhausted = errors.New("no free address in the pod CIDR")

// NewIPAM loads the allocations in path (if it exists and is for the same
// CIDR) for prefix.
func NewIPAM(prefix netip.Prefix, path string) (*IPAM, error) {
	prefix = prefix.Masked()
	if (prefix.Addr().Is4() && prefix.Bits() > 30) || (prefix.Addr().Is6() && prefix.Bits() > 126) {
		return nil, fmt.Errorf("pod CIDR %s: need an IPv4 prefix of /30 or larger, or an IPv6 one of /126 or larger", prefix)
	}
	m := &IPAM{prefix: prefix, path: path, byKey: map[string]netip.Addr{}}
	data, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return m, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading IP allocations %s: %w", path, err)
	}
	var f ipamFile
	if err := json.Unmarshal(data, &f); err != nil {
		return nil, fmt.Errorf("parsing IP allocations %s: %w", path, err)
	}
	if f.CIDR != prefix.String() {
		// A different CIDR: the old allocations mean nothing here.
		return m, nil
	}
	for k, s := range f.Allocations {
		a, err := netip.ParseAddr(s)
		if err != nil || !prefix.Contains(a) {
			continue
		}
		m.byKey[k] = a
	}
	return m, nil
}

// Allocate returns key's address, assigning the lowest free one if it has none.
func (m *IPAM) Allocate(key string) (netip.Addr, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if a, ok := m.byKey[key]; ok {
		return a, nil
	}
	used := make(map[netip.Addr]bool, len(m.byKey))
	for _, a := range m.byKey {
		used[a] = true
	}
	var bcast netip.Addr // IPv6 has no broadcast address
	if m.prefix.Addr().Is4() {
		bcast = lastAddr(m.prefix)
	}
	for a := m.prefix.Addr().Next().Next(); a.IsValid() && m.prefix.Contains(a) && a != bcast; a = a.Next() {
		if used[a] {
			continue
		}
		m.byKey[key] = a
		if err := m.saveLocked(); err != nil {
			delete(m.byKey, key)
			return netip.Addr{}, err
		}
		return a, nil
	}
	return netip.Addr{}, fmt.Errorf("allocating an address for %s from %s: %w", key, m.prefix, ErrPoolExhausted)
}

// Lookup returns key's address if it has one.
func (m *IPAM) Lookup(key string) (netip.Addr, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	a, ok := m.byKey[key]
	return a, ok
}

// Release frees key's address.
func (m *IPAM) Release(key string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.byKey[key]; !ok {
		return nil
	}
	delete(m.byKey, key)
	return m.saveLocked()
}

// Keys returns the keys holding an address.
func (m *IPAM) Keys() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]string, 0, len(m.byKey))
	for k := range m.byKey {
		out = append(out, k)
	}
	sortStrings(out)
	return out
}

func (m *IPAM) saveLocked() error {
	f := ipamFile{CIDR: m.prefix.String(), Allocations: map[string]string{}}
	for k, a := range m.byKey {
		f.Allocations[k] = a.String()
	}
	data, err := json.MarshalIndent(f, "", "  ")
	if err != nil {
		return fmt.Errorf("encoding IP allocations: %w", err)
	}
	return writeFileAtomic(m.path, data, 0o644)
}

// lastAddr is p's highest address (IPv4: the broadcast address).
func lastAddr(p netip.Prefix) netip.Addr {
	b := p.Masked().Addr().AsSlice()
	for i := range b {
		if bit := p.Bits() - 8*i; bit < 8 {
			b[i] |= byte(0xff >> max(bit, 0))
		}
	}
	a, _ := netip.AddrFromSlice(b)
	return a
}
