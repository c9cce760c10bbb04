package probe

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// ChaosOptions configure RunChaos: the nemesis's checker on the client.
type ChaosOptions struct {
	// Targets are the Service IPs watched.
	Targets []netip.Addr
	// ARPInterval is the time between two ARP requests (NDP solicitations)
	// for each target (default 100 ms).
	ARPInterval time.Duration
	// KeepAlive persistent connections per target (default 4), one request
	// each per KeepAliveInterval (default 100 ms), timeout KeepAliveTimeout.
	KeepAlive         int
	KeepAliveInterval time.Duration
	KeepAliveTimeout  time.Duration
	// NewConnInterval is the time between two new connections to each
	// target (default 20 ms), each with NewConnTimeout (default 1 s).
	NewConnInterval time.Duration
	NewConnTimeout  time.Duration
	// OnReady is called once every persistent connection has been answered.
	OnReady func()
}

// ChaosTarget is what RunChaos recorded about one target.
type ChaosTarget struct {
	IP string `json:"ip"`
	// ARPStart and ARPEnd bound the time it was asked for every ARPInterval.
	ARPStart  time.Time       `json:"arp_start"`
	ARPEnd    time.Time       `json:"arp_end"`
	ARPErr    string          `json:"arp_err,omitempty"`
	ARP       []ARPRecord     `json:"-"`
	NewConns  []Record        `json:"-"`
	KeepAlive KeepAliveReport `json:"keepalive"`
}

// ChaosReport is RunChaos's result.
type ChaosReport struct {
	Start         time.Time      `json:"start"`
	End           time.Time      `json:"end"`
	ARPIntervalMS float64        `json:"arp_interval_ms"`
	Targets       []*ChaosTarget `json:"targets"`
}

// RunChaos watches every target until ctx ends, the way the nemesis's
// checker needs it: ARP (NDP) requests every ARPInterval recording every
// MAC that answers, persistent connections counting the breaks, and new
// connections recording each try. Each target's probes run on their own,
// so one IP nobody answers does not slow the records of the others.
func RunChaos(ctx context.Context, o ChaosOptions) (ChaosReport, error) {
	if len(o.Targets) == 0 {
		return ChaosReport{}, fmt.Errorf("no targets")
	}
	if o.ARPInterval <= 0 {
		o.ARPInterval = 100 * time.Millisecond
	}
	if o.KeepAlive <= 0 {
		o.KeepAlive = 4
	}
	if o.NewConnInterval <= 0 {
		o.NewConnInterval = DefaultInterval
	}
	rep := ChaosReport{Start: time.Now(), ARPIntervalMS: ms(o.ARPInterval)}
	var (
		wg      sync.WaitGroup
		pending atomic.Int32
		errMu   sync.Mutex
		firstEr error
	)
	pending.Store(int32(len(o.Targets)))
	for _, ip := range o.Targets {
		t := &ChaosTarget{IP: ip.String()}
		rep.Targets = append(rep.Targets, t)
		url := "http://" + net.JoinHostPort(ip.String(), "80") + "/"
		wg.Add(3)
		go func() {
			defer wg.Done()
			t.ARPStart = time.Now()
			recs, err := RunARP(ctx, ARPOptions{Target: ip, Interval: o.ARPInterval})
			t.ARPEnd = time.Now()
			t.ARP = recs
			if err != nil {
				t.ARPErr = err.Error()
			}
		}()
		go func() {
			defer wg.Done()
			t.NewConns = Run(ctx, Options{URL: url, Interval: o.NewConnInterval, Timeout: o.NewConnTimeout})
		}()
		go func() {
			defer wg.Done()
			ka, err := RunKeepAlive(ctx, KeepAliveOptions{URL: url, Conns: o.KeepAlive, Interval: o.KeepAliveInterval, Timeout: o.KeepAliveTimeout,
				onReady: func() {
					if pending.Add(-1) == 0 && o.OnReady != nil {
						o.OnReady()
					}
				}})
			t.KeepAlive = ka
			if err != nil {
				errMu.Lock()
				if firstEr == nil {
					firstEr = err
				}
				errMu.Unlock()
			}
		}()
	}
	wg.Wait()
	rep.End = time.Now()
	return rep, firstEr
}

// WriteChaos prints the records, one per line ("chaos-arp <ip> <unix ns>
// <mac> reply|request", "chaos-new <ip> <unix ns> ok|fail [error]"), then the
// report as one line of JSON.
func WriteChaos(w io.Writer, r ChaosReport) error {
	bw := bufio.NewWriter(w)
	for _, t := range r.Targets {
		for _, a := range t.ARP {
			op := "request"
			if a.Reply {
				op = "reply"
			}
			// bufio.Writer keeps the first write error; Flush below returns it.
			_, _ = fmt.Fprintf(bw, "chaos-arp %s %d %s %s\n", t.IP, a.At.UnixNano(), a.MAC, op)
		}
		for _, n := range t.NewConns {
			st := "ok"
			if !n.OK {
				st = "fail"
			}
			_, _ = fmt.Fprintf(bw, "chaos-new %s %d %s %s\n", t.IP, n.Sent.UnixNano(), st, strings.ReplaceAll(n.Err, "\n", " "))
		}
	}
	if err := json.NewEncoder(bw).Encode(r); err != nil {
		return err
	}
	return bw.Flush()
}

// ParseChaos reads what WriteChaos printed.
func ParseChaos(out string) (ChaosReport, error) {
	var rep ChaosReport
	var jsonLine string
	arps := map[string][]ARPRecord{}
	news := map[string][]Record{}
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		switch {
		case strings.HasPrefix(line, "{"):
			jsonLine = line
		case len(f) == 5 && f[0] == "chaos-arp":
			at, err := strconv.ParseInt(f[2], 10, 64)
			mac, err2 := net.ParseMAC(f[3])
			if err != nil || err2 != nil {
				continue
			}
			arps[f[1]] = append(arps[f[1]], ARPRecord{At: time.Unix(0, at), MAC: mac, Reply: f[4] == "reply"})
		case len(f) >= 4 && f[0] == "chaos-new":
			at, err := strconv.ParseInt(f[2], 10, 64)
			if err != nil {
				continue
			}
			r := Record{Sent: time.Unix(0, at), OK: f[3] == "ok"}
			if len(f) > 4 {
				r.Err = strings.Join(f[4:], " ")
			}
			news[f[1]] = append(news[f[1]], r)
		}
	}
	if jsonLine == "" {
		return rep, fmt.Errorf("no JSON summary in e2e-probe --chaos output (%d bytes)", len(out))
	}
	if err := json.Unmarshal([]byte(jsonLine), &rep); err != nil {
		return rep, fmt.Errorf("e2e-probe --chaos summary: %w", err)
	}
	for _, t := range rep.Targets {
		t.ARP, t.NewConns = arps[t.IP], news[t.IP]
	}
	return rep, nil
}
