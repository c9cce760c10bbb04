package probe

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/mdlayher/arp"
)

// ARPOptions configure RunARP.
type ARPOptions struct {
	// Target is the address asked for: by ARP (IPv4) or NDP (IPv6).
	Target netip.Addr
	// Interface to send on; "" picks the interface whose subnet holds Target.
	Interface string
	// Interval between requests (default 10 ms).
	Interval time.Duration
	// StopFile: RunARP returns once this file exists (it is removed first).
	StopFile string
	// Duration bounds the run (0: until StopFile or ctx).
	Duration time.Duration
}

// ARPRecord is one ARP packet whose sender is the target: an answer to our
// requests, or an announcement (gratuitous request or reply) by the holder; or for an
// IPv6 target one Neighbor Advertisement for it (solicited or not).
type ARPRecord struct {
	At  time.Time
	MAC net.HardwareAddr
	// Reply: an ARP reply (to us or gratuitous) or an NA; else a gratuitous request.
	Reply bool
	// NDP marks a Neighbor Advertisement; Router, Solicited and Override are its flags.
	NDP                         bool
	Router, Solicited, Override bool
}

// RunARP asks "who has Target?" every Interval from the client, the way a
// host resolving the address would, and records every ARP packet the target's
// holder sends, with the time it arrived. Unlike the HTTP probe, it sees the
// moment an address starts to be answered, independent of what happens to
// the traffic on the node after that. For an IPv6 target it does the same with
// Neighbor Solicitations and Advertisements.
func RunARP(ctx context.Context, o ARPOptions) ([]ARPRecord, error) {
	if !o.Target.IsValid() {
		return nil, fmt.Errorf("no target address")
	}
	if o.Interval <= 0 {
		o.Interval = 10 * time.Millisecond
	}
	ifi, err := interfaceFor(o.Interface, o.Target)
	if err != nil {
		return nil, err
	}
	if isIPv6(o.Target) {
		return runNDP(ctx, o, ifi)
	}
	c, err := arp.Dial(ifi)
	if err != nil {
		return nil, fmt.Errorf("ARP socket on %s: %w", ifi.Name, err)
	}
	read := func() (ARPRecord, bool, error) {
		p, _, err := c.Read()
		if err != nil || p.SenderIP != o.Target {
			return ARPRecord{}, false, err
		}
		return ARPRecord{MAC: p.SenderHardwareAddr, Reply: p.Operation == arp.OperationReply}, true, nil
	}
	ask := func() error {
		if err := c.Request(o.Target); err != nil {
			return fmt.Errorf("sending ARP request for %v on %s: %w", o.Target, ifi.Name, err)
		}
		return nil
	}
	return collect(ctx, o, read, ask, c.Close)
}

// collect records what read returns (stamped with its arrival time; records
// it does not keep and unreadable packets are skipped) while ask runs every
// o.Interval until ctx, o.StopFile or o.Duration ends the run, lingers for
// the last answer, then closes the socket, which ends read with an error.
// The error is the first ask failed with.
func collect(ctx context.Context, o ARPOptions, read func() (ARPRecord, bool, error), ask func() error, closeConn func() error) ([]ARPRecord, error) {
	var (
		mu     sync.Mutex
		recs   []ARPRecord
		wg     sync.WaitGroup
		closed atomic.Bool
	)
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			r, keep, err := read()
			at := time.Now()
			if err != nil && closed.Load() {
				return
			}
			if err != nil || !keep {
				continue
			}
			r.At = at
			mu.Lock()
			recs = append(recs, r)
			mu.Unlock()
		}
	}()

	var sendErr error
	ctx, cancel := StopWhen(ctx, o.StopFile, o.Duration)
	defer cancel()
	every(ctx, o.Interval, func(time.Time) {
		if err := ask(); err != nil && sendErr == nil {
			sendErr = err
		}
	})
	// Linger for the answer to the last request (a round trip on the segment).
	time.Sleep(50 * time.Millisecond)
	closed.Store(true)
	_ = closeConn() // unblocks read; nothing was buffered for writing
	wg.Wait()
	return recs, sendErr
}

// interfaceFor returns the named interface, or the one with an address whose
// prefix contains target.
func interfaceFor(name string, target netip.Addr) (*net.Interface, error) {
	if name != "" {
		ifi, err := net.InterfaceByName(name)
		if err != nil {
			return nil, fmt.Errorf("interface %q: %w", name, err)
		}
		return ifi, nil
	}
	ifs, err := net.Interfaces()
	if err != nil {
		return nil, fmt.Errorf("listing interfaces: %w", err)
	}
	for i := range ifs {
		addrs, err := ifs[i].Addrs()
		if err != nil {
			continue
		}
		for _, a := range addrs {
			if p, err := netip.ParsePrefix(a.String()); err == nil && p.Masked().Contains(target) {
				return &ifs[i], nil
			}
		}
	}
	return nil, fmt.Errorf("no interface has a subnet holding %v; pass --iface", target)
}

// WriteARP prints records one per line: "arp <unix ns> <mac> reply|request", or
// "ndp <unix ns> <mac> reply <flags>" for a Neighbor Advertisement (flags: R, S and O
// for Router, Solicited and Override; "-" for none).
func WriteARP(w io.Writer, recs []ARPRecord) error {
	bw := bufio.NewWriter(w)
	for _, r := range recs {
		op := "request"
		if r.Reply {
			op = "reply"
		}
		// bufio.Writer keeps the first write error; Flush below returns it.
		if r.NDP {
			_, _ = fmt.Fprintf(bw, "ndp %d %s %s %s\n", r.At.UnixNano(), r.MAC, op, ndpFlags(r))
		} else {
			_, _ = fmt.Fprintf(bw, "arp %d %s %s\n", r.At.UnixNano(), r.MAC, op)
		}
	}
	return bw.Flush()
}

// ParseARP reads what WriteARP printed; other lines are ignored.
func ParseARP(s string) []ARPRecord {
	var out []ARPRecord
	for _, line := range strings.Split(s, "\n") {
		f := strings.Fields(line)
		ok := (len(f) == 4 && f[0] == "arp") || (len(f) == 5 && f[0] == "ndp")
		if !ok || (f[3] != "reply" && f[3] != "request") {
			continue
		}
		at, err := strconv.ParseInt(f[1], 10, 64)
		if err != nil {
			continue
		}
		mac, err := net.ParseMAC(f[2])
		if err != nil {
			continue
		}
		r := ARPRecord{At: time.Unix(0, at), MAC: mac, Reply: f[3] == "reply", NDP: f[0] == "ndp"}
		if r.NDP {
			r.Router, r.Solicited, r.Override = strings.Contains(f[4], "R"), strings.Contains(f[4], "S"), strings.Contains(f[4], "O")
		}
		out = append(out, r)
	}
	return out
}
