//go:build linux

package layer2

import (
	"context"
	"encoding/binary"
	"net"
	"net/netip"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/mdlayher/packet"
	"golang.org/x/sys/unix"
)

// percentile returns the p-th percentile (0-100) of sorted samples.
func percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(float64(len(sorted)-1) * p / 100)
	return sorted[i]
}

// BenchmarkNetnsARPReplyLatency measures, from a client namespace, the time
// from sending an ARP request for an owned VIP to receiving the reply
// (announcer in its own namespace, over a veth pair). One request per
// iteration; run with -benchtime 2000x. Reports p50/p99 in microseconds.
func BenchmarkNetnsARPReplyLatency(b *testing.B) {
	l := newLab(b)
	h := l.startAnnouncer(b)
	if got := h.do(b, "set bench/vip "+l.vip4.String()); got != "ok" {
		b.Fatalf("set: %s", got)
	}
	c := l.clientConn(b)
	req, err := arpFrameBytesFor(l.macC, l.ip4C, l.vip4)
	if err != nil {
		b.Fatal(err)
	}
	buf := make([]byte, 128)
	// Warm up (and let the gratuitous burst's first frames pass).
	for range 20 {
		if _, _, err := l.resolve(c, req, l.vip4, buf, 5*time.Second); err != nil {
			b.Fatal(err)
		}
	}
	enableRxTimestamps(b, c)
	oob := make([]byte, 128)
	app := make([]time.Duration, 0, b.N)
	wire := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for b.Loop() {
		a, w, err := resolveTimed(c, req, l.vip4, buf, oob, 5*time.Second)
		if err != nil {
			b.Fatal(err)
		}
		app, wire = append(app, a), append(wire, w)
	}
	b.StopTimer()
	slices.Sort(app)
	slices.Sort(wire)
	us := func(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e3 }
	b.ReportMetric(us(percentile(app, 50)), "p50-us")
	b.ReportMetric(us(percentile(app, 99)), "p99-us")
	b.ReportMetric(us(app[len(app)-1]), "max-us")
	b.ReportMetric(us(percentile(wire, 50)), "wire-p50-us")
	b.ReportMetric(us(percentile(wire, 99)), "wire-p99-us")
}

// enableRxTimestamps turns on SO_TIMESTAMPNS: the kernel stamps each frame
// when it reaches the client's socket, so the client's own scheduling delay
// (getting the test goroutine back on a CPU) can be told apart from the
// announcer's.
func enableRxTimestamps(b *testing.B, c *packet.Conn) {
	rc, err := c.SyscallConn()
	if err != nil {
		b.Fatal(err)
	}
	var serr error
	if err := rc.Control(func(fd uintptr) {
		serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_TIMESTAMPNS, 1)
	}); err != nil || serr != nil {
		b.Fatalf("SO_TIMESTAMPNS: %v %v", err, serr)
	}
}

// resolveTimed is resolve returning two round-trip times: as the client
// program sees it (app) and up to the kernel's receive timestamp (wire).
func resolveTimed(c *packet.Conn, req []byte, ip netip.Addr, buf, oob []byte, timeout time.Duration) (app, wire time.Duration, err error) {
	rc, err := c.SyscallConn()
	if err != nil {
		return 0, 0, err
	}
	start := time.Now()
	if _, err := c.WriteTo(req, &packet.Addr{HardwareAddr: net.HardwareAddr(broadcastMAC[:])}); err != nil {
		return 0, 0, err
	}
	_ = c.SetReadDeadline(start.Add(timeout))
	var f arpFrame
	for {
		var n, oobn int
		var rerr error
		if err := rc.Read(func(fd uintptr) bool {
			n, oobn, _, _, rerr = unix.Recvmsg(int(fd), buf, oob, 0)
			return rerr != unix.EAGAIN
		}); err != nil {
			return 0, 0, err
		}
		if rerr != nil {
			return 0, 0, rerr
		}
		if !parseARP(buf[:n], &f) || f.op != arpOpReply || f.spa != v4key(ip) || [6]byte(req[6:12]) != f.ethDst {
			continue
		}
		app = time.Since(start)
		msgs, err := unix.ParseSocketControlMessage(oob[:oobn])
		if err != nil {
			return 0, 0, err
		}
		for _, m := range msgs {
			if m.Header.Level == unix.SOL_SOCKET && m.Header.Type == unix.SO_TIMESTAMPNS && len(m.Data) >= 16 {
				sec := int64(binary.NativeEndian.Uint64(m.Data[0:8]))
				nsec := int64(binary.NativeEndian.Uint64(m.Data[8:16]))
				wire = time.Unix(sec, nsec).Sub(start)
			}
		}
		return app, wire, nil
	}
}

// BenchmarkNetnsARPFlood floods the announcer with 50,000 ARP requests per
// second for IPs it does not own, for 10 s, while probing its own VIP every
// 20 ms. It reports the announcer process's CPU (percent of one core), the
// rate actually sent, and the VIP probes answered and their latency. The
// flood runs once whatever b.N is; run with -benchtime 1x. Sub-benchmarks:
// kernel-filter (the default: the socket filter holds the owned IPs) and
// userspace-only (generic ARP filter; the owned check in user space).
func BenchmarkNetnsARPFlood(b *testing.B) {
	b.Run("kernel-filter", func(b *testing.B) { benchFlood(b) })
	b.Run("userspace-only", func(b *testing.B) { benchFlood(b, "ILB_L2_USERSPACE_FILTER_ONLY=1") })
}

func benchFlood(b *testing.B, env ...string) {
	const (
		rate     = 50_000
		duration = 10 * time.Second
	)
	l := newLab(b)
	h := l.startAnnouncer(b, env...)
	if got := h.do(b, "set bench/vip "+l.vip4.String()); got != "ok" {
		b.Fatalf("set: %s", got)
	}
	flood := l.clientConn(b)
	probe := l.clientConn(b)
	probeReq, err := arpFrameBytesFor(l.macC, l.ip4C, l.vip4)
	if err != nil {
		b.Fatal(err)
	}
	// Let the takeover burst settle before measuring.
	if _, _, err := l.resolve(probe, probeReq, l.vip4, make([]byte, 128), 5*time.Second); err != nil {
		b.Fatal(err)
	}
	base, err := arpFrameBytesFor(l.macC, l.ip4C, netip.MustParseAddr("10.251.128.0"))
	if err != nil {
		b.Fatal(err)
	}

	b.ResetTimer()
	var sent atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		frame := slices.Clone(base)
		dst := &packet.Addr{HardwareAddr: net.HardwareAddr(broadcastMAC[:])}
		start := time.Now()
		var n int64
		for {
			select {
			case <-stop:
				return
			default:
			}
			due := int64(time.Since(start).Seconds() * rate)
			for ; n < due; n++ {
				// Targets cycle through 10.251.128.0/17: none is owned.
				binary.BigEndian.PutUint32(frame[38:42], 0x0afb8000|uint32(n&0x7fff))
				if _, err := flood.WriteTo(frame, dst); err == nil {
					sent.Add(1)
				}
			}
			time.Sleep(200 * time.Microsecond)
		}
	}()

	cpu0 := h.cpu()
	t0 := time.Now()
	var lat []time.Duration
	probes, answered := 0, 0
	buf := make([]byte, 128)
	for time.Since(t0) < duration {
		probes++
		if _, rtt, err := l.resolve(probe, probeReq, l.vip4, buf, time.Second); err == nil {
			answered++
			lat = append(lat, rtt)
		}
		time.Sleep(20 * time.Millisecond)
	}
	elapsed := time.Since(t0)
	cpu := h.cpu() - cpu0
	close(stop)
	wg.Wait()
	b.StopTimer()

	slices.Sort(lat)
	b.ReportMetric(100*cpu.Seconds()/elapsed.Seconds(), "announcer-cpu-%")
	b.ReportMetric(float64(sent.Load())/elapsed.Seconds(), "flood-req/s")
	b.ReportMetric(float64(answered), "vip-answered")
	b.ReportMetric(float64(probes), "vip-probes")
	b.ReportMetric(float64(percentile(lat, 50).Nanoseconds())/1e3, "vip-p50-us")
	b.ReportMetric(float64(percentile(lat, 99).Nanoseconds())/1e3, "vip-p99-us")
}

// BenchmarkNetnsProberCPU probes a live namespace's kernel from the lab's A
// namespace at 20 probes per second per target, for a dual-stack node (its
// IPv4 and IPv6 address: 40 probes/s) during 10 s, and reports the CPU of
// the test process (the prober, plus whatever softirq work the kernel
// charges to it: an upper bound) in percent of one core, the answered
// fraction and the answer RTT. It runs once whatever b.N is; run with
// -benchtime 1x.
func BenchmarkNetnsProberCPU(b *testing.B) {
	l := newLab(b)
	var links []Link
	var err error
	inNetns(b, l.nsA, func() { links, err = netlinkLinks() })
	if err != nil {
		b.Fatal(err)
	}
	inA := func(listen func(Link) (net.PacketConn, error)) func(Link) (net.PacketConn, error) {
		return func(k Link) (c net.PacketConn, err error) {
			inNetns(b, l.nsA, func() { c, err = listen(k) })
			return c, err
		}
	}
	p := NewProber(logr.Discard(), ProberOptions{
		Links:     func() ([]Link, error) { return links, nil },
		ListenARP: inA(listenProbeARP),
		ListenNDP: inA(listenProbeNDP),
	})
	defer func() { _ = p.Close() }()
	targets := []netip.Addr{l.ip4C, netip.MustParseAddr("fd00:251::2")}
	ctx := context.Background()
	// Open the sockets and learn the MACs; the target's IPv6 addresses are
	// usable only once its link has carrier, which the kernel signals
	// asynchronously.
	for _, t := range targets {
		deadline := time.Now().Add(10 * time.Second)
		for r := p.Probe(ctx, t); !r.Reachable; r = p.Probe(ctx, t) {
			if time.Now().After(deadline) {
				b.Fatalf("warm-up: %+v", r)
			}
		}
	}
	const (
		interval = 50 * time.Millisecond // 20 probes/s per target
		duration = 10 * time.Second
	)
	for b.Loop() {
		var (
			mu       sync.Mutex
			rtts     []time.Duration
			sent     int
			wg       sync.WaitGroup
			start    = time.Now()
			cpuStart = procCPU(b, os.Getpid())
		)
		for _, t := range targets {
			wg.Add(1)
			go func() {
				defer wg.Done()
				tick := time.NewTicker(interval)
				defer tick.Stop()
				for time.Since(start) < duration {
					r := p.Probe(ctx, t)
					mu.Lock()
					sent++
					if r.Reachable {
						rtts = append(rtts, r.RTT)
					}
					mu.Unlock()
					<-tick.C
				}
			}()
		}
		wg.Wait()
		elapsed, cpu := time.Since(start), procCPU(b, os.Getpid())-cpuStart
		slices.Sort(rtts)
		us := func(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e3 }
		b.ReportMetric(100*cpu.Seconds()/elapsed.Seconds(), "process-cpu-%")
		b.ReportMetric(float64(sent)/elapsed.Seconds(), "probes/s")
		b.ReportMetric(float64(len(rtts))/float64(sent), "answered")
		b.ReportMetric(us(percentile(rtts, 50)), "rtt-p50-us")
		b.ReportMetric(us(percentile(rtts, 99)), "rtt-p99-us")
	}
}
