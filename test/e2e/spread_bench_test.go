//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ironlb/ironlb/test/e2e/probe"
)

// BenchmarkSpreadThroughput (make bench-spread; issue 23) drives one
// Service from mypc with many persistent HTTP connections, first with one
// address (one announcing node), then with three addresses on three nodes
// (ironlb.io/address-count: 3), the connections split evenly over the
// addresses as DNS round robin splits clients: requests per second, and
// the share of the packets each node received. Every lab host shares this
// machine's CPUs, so the total shows what the spread costs or gains here;
// the shares show the spread itself.
func BenchmarkSpreadThroughput(b *testing.B) {
	e := benchEnv(b)
	conns := getenvInt("E2E_SPREAD_CONNS", 24)
	dur := time.Duration(getenvInt("E2E_SPREAD_SECONDS", 20)) * time.Second
	for _, c := range []struct {
		name  string
		count int
		pool  string
	}{
		{"one-node", 1, "172.18.254.188/32"},
		{"three-nodes", 3, spreadPool4},
	} {
		sp := e.newSpreadService(b, "e2e-bench-"+c.name, c.count, []string{c.pool}, nil)
		for _, ip := range sp.ips {
			e.waitServing(b, ip)
		}
		counted := e.countPacketsTo(b, sp.ips)
		var loops []*clientLoop
		for i, ip := range sp.ips {
			n := conns / len(sp.ips)
			if i < conns%len(sp.ips) {
				n++
			}
			loops = append(loops, e.runProbe("--url", serviceURL(ip), "--keepalive", strconv.Itoa(n),
				"--keepalive-interval", "1ms", "--new-conns=false"))
		}
		b.Logf("%s: %d connections over %v (announced from %v), %s", c.name, conns, sp.ips, sp.owner, dur)
		time.Sleep(dur) // the measurement window: the load runs this long
		ok, errs := 0, 0
		for _, l := range loops {
			l.finish(b)
			rep, err := probe.ParseReport(l.res.Stdout)
			if err != nil || rep.KeepAlive == nil {
				b.Fatalf("probe report: %v\n%s", err, l.res.Stderr)
			}
			ok, errs = ok+rep.KeepAlive.OK, errs+rep.KeepAlive.Errors
		}
		got := counted()
		var total int64
		for _, v := range got {
			total += v
		}
		var shares []string
		for _, n := range slices.Sorted(maps.Keys(got)) {
			shares = append(shares, fmt.Sprintf("%s %.0f%%", n, 100*float64(got[n])/float64(max(total, 1))))
		}
		rps := float64(ok) / dur.Seconds()
		b.Logf("%s: %.0f requests/s (%d ok, %d errors); packets to the Service's addresses received by node: %s", c.name, rps, ok, errs, strings.Join(shares, ", "))
		b.ReportMetric(rps, c.name+"-req/s")
	}
}

// countPacketsTo makes every node count the packets it receives for ips (a
// rule without a target in the raw table's PREROUTING, before kube-proxy's
// rules); the function returned reads each node's count and removes the
// rules. The segment delivers a packet for an address only to the node
// whose MAC answered for it.
func (e *Env) countPacketsTo(tb testing.TB, ips []string) func() map[string]int64 {
	tb.Helper()
	ctx := context.Background()
	nodes := e.topology(tb).nodes
	const mark = "ironlb-bench-count"
	rule := func(op, ip string) []string {
		cmd := "iptables"
		if netip.MustParseAddr(ip).Is6() {
			cmd = "ip6tables"
		}
		return []string{cmd, "-w", "-t", "raw", op, "PREROUTING", "-d", ip, "-m", "comment", "--comment", mark}
	}
	for _, n := range nodes {
		for _, ip := range ips {
			if r, err := e.Hosts.Run(ctx, n, rule("-I", ip)...); err != nil || r.Code != 0 {
				tb.Fatalf("node %s: counting rule for %s: %v %s", n, ip, err, r.Stderr)
			}
		}
	}
	remove := func() {
		for _, n := range nodes {
			for _, ip := range ips {
				_, _ = e.Hosts.Run(ctx, n, rule("-D", ip)...) // gone already: nothing to remove
			}
		}
	}
	tb.Cleanup(remove)
	return func() map[string]int64 {
		out := map[string]int64{}
		for _, n := range nodes {
			for _, cmd := range []string{"iptables", "ip6tables"} {
				r, err := e.Hosts.Run(ctx, n, cmd, "-w", "-t", "raw", "-L", "PREROUTING", "-v", "-x", "-n")
				if err != nil || r.Code != 0 {
					tb.Fatalf("node %s: %s -L: %v %s", n, cmd, err, r.Stderr)
				}
				for _, line := range strings.Split(r.Stdout, "\n") {
					if f := strings.Fields(line); len(f) > 0 && strings.Contains(line, mark) {
						v, err := strconv.ParseInt(f[0], 10, 64)
						if err != nil {
							tb.Fatalf("node %s: counter %q: %v", n, line, err)
						}
						out[n] += v
					}
				}
			}
		}
		remove()
		return out
	}
}
