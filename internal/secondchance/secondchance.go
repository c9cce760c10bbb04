package secondchance

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"

	"github.com/google/nftables"
)

// Forward is one IP whose TCP flows unknown to this node go to its previous owner.
type Forward struct {
	VIP    netip.Addr       // IPv4 or IPv6
	OldMAC net.HardwareAddr // the previous owner's MAC on this interface
}

// Stats is what the table did.
type Stats struct {
	ForwardedPackets uint64 // packets sent on to previous owners (both families)
	ForwardedFlows   int    // flows forwarded within the last 2 minutes (elements of the forwarded-flow sets)
	LocalFlows       int    // flows this node started serving since the forwards were set
	// ForwardedByVIP splits ForwardedFlows by the IP the flows are
	// addressed to (nil when there are none).
	ForwardedByVIP map[netip.Addr]int
}

// ErrInvalidForward is wrapped by the error Set returns for input it refuses
// before touching the kernel.
var ErrInvalidForward = errors.New("invalid forward")

// tablePrefix starts the name of every table of this package.
const tablePrefix = "ironlb-sc-"

// Table owns one interface's second-chance nftables table ("ironlb-sc-<ifname>", family netdev).
//
// The table lives in the network namespace of the thread that calls Set (a
// netlink socket is opened per operation). A Table is safe for concurrent
// use.
type Table struct {
	ifname string
	nft    *nftables.Table

	mu sync.Mutex
	// active says this Table created the kernel table and has not deleted
	// it since; objs and ownMAC then describe what it holds.
	active bool
	objs   [2]objects // per family, in the order of families
	ownMAC net.HardwareAddr
	// current is the forwards in the kernel map (sorted, normalized), so
	// that a Set repeating them does not rewrite the map.
	current []Forward
}

// Open returns the Table of the named interface; it creates nothing until Set is given a forward.
// A table left by a previous process (a restarted speaker) is removed.
func Open(ifname string) (*Table, error) {
	if err := checkIfname(ifname); err != nil {
		return nil, err
	}
	t := newTable(ifname)
	// A previous process's table forwards to MACs this one knows nothing
	// of, and its local sets are as old as its forwards: start afresh.
	if err := t.remove(); err != nil {
		return nil, t.errorf("removing the table of a previous process: %w", err)
	}
	return t, nil
}

func newTable(ifname string) *Table {
	return &Table{ifname: ifname, nft: &nftables.Table{Name: tablePrefix + ifname, Family: nftables.TableFamilyNetdev}}
}

// checkIfname refuses what cannot be an interface name (the kernel's rules).
func checkIfname(s string) error {
	if s == "" || len(s) >= 16 || s == "." || s == ".." || strings.ContainsAny(s, "/: \t\n") {
		return fmt.Errorf("secondchance: %q is not an interface name", s)
	}
	return nil
}

func (t *Table) errorf(format string, args ...any) error {
	return fmt.Errorf("secondchance: interface %s: "+format, append([]any{t.ifname}, args...)...)
}

// Set makes fwds the forwarded IPs: the first non-empty Set creates the table, sets, chain and rules;
// later calls replace only the vips4/vips6 map elements in one atomic batch, so that the local-flow
// sets survive (a flow the node started serving must never be forwarded later); an empty Set deletes the table.
// Invalid input (an invalid or zero address, a MAC that is not 6 bytes) is an error naming the value.
//
// Two more cases rebuild part of the table: when the interface's own MAC
// changed since the rules were written, the rules are rewritten in the same
// batch as the map (the sets and counters stay); when the table is gone
// (deleted by someone else), it is created again.
func (t *Table) Set(fwds []Forward) error {
	want, err := normalize(fwds)
	if err != nil {
		return t.errorf("%w", err)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(want) == 0 {
		if err := t.remove(); err != nil {
			return t.errorf("deleting the table: %w", err)
		}
		return nil
	}
	own, err := t.interfaceMAC()
	if err != nil {
		return err
	}
	for _, f := range want {
		if bytes.Equal(f.OldMAC, own) {
			return t.errorf("%w: VIP %s: previous owner's MAC %s is this interface's own", ErrInvalidForward, f.VIP, f.OldMAC)
		}
	}
	if !t.active {
		return t.create(own, want)
	}
	if bytes.Equal(own, t.ownMAC) && slices.EqualFunc(want, t.current, sameForward) {
		// Nothing to write; make sure the table is still there.
		ok, err := t.exists()
		if err != nil {
			return t.errorf("listing tables: %w", err)
		}
		if !ok {
			return t.create(own, want)
		}
		return nil
	}
	if err := t.update(own, want); err != nil {
		if ok, lerr := t.exists(); lerr == nil && !ok {
			return t.create(own, want)
		}
		return err
	}
	return nil
}

// normalize validates fwds and returns them sorted by VIP, IPv4-mapped IPv6
// addresses unmapped, duplicates removed.
func normalize(fwds []Forward) ([]Forward, error) {
	out := make([]Forward, 0, len(fwds))
	for _, f := range fwds {
		vip := f.VIP.Unmap()
		switch {
		case !vip.IsValid():
			return nil, fmt.Errorf("%w: VIP %q is not an IP address", ErrInvalidForward, f.VIP.String())
		case vip.IsUnspecified():
			return nil, fmt.Errorf("%w: VIP %s is the unspecified address", ErrInvalidForward, vip)
		case vip.Zone() != "":
			return nil, fmt.Errorf("%w: VIP %s has a zone", ErrInvalidForward, vip)
		case vip.IsMulticast() || vip.IsLoopback():
			return nil, fmt.Errorf("%w: VIP %s is not a unicast address", ErrInvalidForward, vip)
		}
		switch mac := f.OldMAC; {
		case len(mac) != etherAddrLen:
			return nil, fmt.Errorf("%w: VIP %s: previous owner's MAC %q is not a 6-byte Ethernet address", ErrInvalidForward, vip, mac.String())
		case mac[0]&1 != 0:
			return nil, fmt.Errorf("%w: VIP %s: previous owner's MAC %s is a group address", ErrInvalidForward, vip, mac)
		case bytes.Equal(mac, make(net.HardwareAddr, etherAddrLen)):
			return nil, fmt.Errorf("%w: VIP %s: previous owner's MAC %s is the zero address", ErrInvalidForward, vip, mac)
		}
		out = append(out, Forward{VIP: vip, OldMAC: slices.Clone(f.OldMAC)})
	}
	slices.SortFunc(out, func(a, b Forward) int { return a.VIP.Compare(b.VIP) })
	for i := 1; i < len(out); i++ {
		if out[i].VIP == out[i-1].VIP && !bytes.Equal(out[i].OldMAC, out[i-1].OldMAC) {
			return nil, fmt.Errorf("%w: VIP %s forwarded to two MACs, %s and %s", ErrInvalidForward, out[i].VIP, out[i-1].OldMAC, out[i].OldMAC)
		}
	}
	return slices.CompactFunc(out, sameForward), nil
}

func sameForward(a, b Forward) bool {
	return a.VIP == b.VIP && bytes.Equal(a.OldMAC, b.OldMAC)
}

// interfaceMAC returns the interface's own MAC, the source of the frames
// sent on.
func (t *Table) interfaceMAC() (net.HardwareAddr, error) {
	ifi, err := net.InterfaceByName(t.ifname)
	if err != nil {
		return nil, t.errorf("%w", err)
	}
	if len(ifi.HardwareAddr) != etherAddrLen {
		return nil, t.errorf("not an Ethernet interface (hardware address %q)", ifi.HardwareAddr.String())
	}
	return ifi.HardwareAddr, nil
}

// elements returns the map elements of family f among fwds.
func (f *family) elements(fwds []Forward) []nftables.SetElement {
	var out []nftables.SetElement
	for _, fw := range fwds {
		if (f.addrLen == 4) == fw.VIP.Is4() {
			out = append(out, nftables.SetElement{Key: fw.VIP.AsSlice(), Val: fw.OldMAC})
		}
	}
	return out
}

func (t *Table) chain() *nftables.Chain {
	return &nftables.Chain{
		Name: chainName, Table: t.nft, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookIngress, Priority: nftables.ChainPriorityRef(chainPriority),
		Device: t.ifname,
	}
}

// addRules adds every family's rules to chain c in batch conn.
func (t *Table) addRules(conn *nftables.Conn, c *nftables.Chain, own net.HardwareAddr) {
	for i, f := range families {
		for j, exprs := range f.rules(t.objs[i], own) {
			conn.AddRule(&nftables.Rule{Table: t.nft, Chain: c, Exprs: exprs, UserData: comment(ruleComments[j])})
		}
	}
}

// create writes the whole table in one batch, replacing any table of the
// same name: the sets start empty.
func (t *Table) create(own net.HardwareAddr, want []Forward) error {
	conn, err := nftables.New()
	if err != nil {
		return t.errorf("netlink: %w", err)
	}
	// Adding, deleting and adding again is the idiom for "replace whatever
	// is there" in one transaction: the add before the delete makes the
	// delete valid when no table exists.
	conn.AddTable(t.nft)
	conn.DelTable(t.nft)
	conn.AddTable(t.nft)
	var objs [2]objects
	for i, f := range families {
		objs[i] = f.objects(t.nft)
		// Set IDs name the sets within this batch. They are chosen here,
		// not by the library (which counts in an unguarded global), so
		// that Tables used from different goroutines do not race.
		for k, s := range []*nftables.Set{objs[i].vips, objs[i].local, objs[i].forwarded} {
			s.ID = uint32(3*i + k + 1)
		}
		if err := conn.AddSet(objs[i].vips, f.elements(want)); err != nil {
			return t.errorf("map %s: %w", f.vips, err)
		}
		for _, s := range []*nftables.Set{objs[i].local, objs[i].forwarded} {
			if err := conn.AddSet(s, nil); err != nil {
				return t.errorf("set %s: %w", s.Name, err)
			}
		}
		conn.AddObj(objs[i].counter)
	}
	t.objs = objs
	c := conn.AddChain(t.chain())
	t.addRules(conn, c, own)
	if err := conn.Flush(); err != nil {
		t.active = false
		return t.errorf("creating table %s: %w", t.nft.Name, err)
	}
	t.active, t.ownMAC, t.current = true, slices.Clone(own), want
	return nil
}

// update replaces the maps' elements, and the rules if the interface's MAC
// changed, in one batch. The local and forwarded sets and the counters are
// not touched.
func (t *Table) update(own net.HardwareAddr, want []Forward) error {
	conn, err := nftables.New()
	if err != nil {
		return t.errorf("netlink: %w", err)
	}
	for i, f := range families {
		vips := t.objs[i].vips
		conn.FlushSet(vips)
		if el := f.elements(want); len(el) > 0 {
			if err := conn.SetAddElements(vips, el); err != nil {
				return t.errorf("map %s: %w", vips.Name, err)
			}
		}
	}
	macChanged := !bytes.Equal(own, t.ownMAC)
	if macChanged {
		c := t.chain()
		conn.FlushChain(c)
		t.addRules(conn, c, own)
	}
	if err := conn.Flush(); err != nil {
		return t.errorf("updating table %s: %w", t.nft.Name, err)
	}
	t.ownMAC, t.current = slices.Clone(own), want
	return nil
}

// remove deletes the table if it exists.
func (t *Table) remove() error {
	conn, err := nftables.New()
	if err != nil {
		return err
	}
	conn.AddTable(t.nft) // makes the delete valid when there is no table
	conn.DelTable(t.nft)
	if err := conn.Flush(); err != nil {
		return err
	}
	t.active, t.objs, t.ownMAC, t.current = false, [2]objects{}, nil, nil
	return nil
}

// exists says whether the kernel has the table.
func (t *Table) exists() (bool, error) {
	conn, err := nftables.New()
	if err != nil {
		return false, err
	}
	tables, err := conn.ListTablesOfFamily(nftables.TableFamilyNetdev)
	if err != nil {
		return false, err
	}
	return slices.ContainsFunc(tables, func(tb *nftables.Table) bool { return tb.Name == t.nft.Name }), nil
}

// Stats reads the counters and set sizes (zero when no table exists).
func (t *Table) Stats() (Stats, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	var st Stats
	if !t.active {
		return st, nil
	}
	conn, err := nftables.New()
	if err != nil {
		return st, t.errorf("netlink: %w", err)
	}
	objs, err := conn.GetObjects(t.nft)
	if err != nil {
		return st, t.errorf("reading counters: %w", err)
	}
	for _, o := range objs {
		c, ok := o.(*nftables.CounterObj)
		if !ok {
			continue
		}
		for i := range families {
			if c.Name == t.objs[i].counter.Name {
				st.ForwardedPackets += c.Packets
			}
		}
	}
	for i := range families {
		for _, s := range []struct {
			set *nftables.Set
			n   *int
		}{{t.objs[i].forwarded, &st.ForwardedFlows}, {t.objs[i].local, &st.LocalFlows}} {
			el, err := conn.GetSetElements(s.set)
			if err != nil {
				return Stats{}, t.errorf("reading set %s: %w", s.set.Name, err)
			}
			*s.n += len(el)
			if s.set != t.objs[i].forwarded {
				continue
			}
			for _, e := range el {
				if vip, ok := families[i].flowVIP(e.Key); ok {
					if st.ForwardedByVIP == nil {
						st.ForwardedByVIP = map[netip.Addr]int{}
					}
					st.ForwardedByVIP[vip]++
				}
			}
		}
	}
	return st, nil
}

// Close deletes the table.
func (t *Table) Close() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if err := t.remove(); err != nil {
		return t.errorf("deleting the table: %w", err)
	}
	return nil
}
