// Package probe is the e2e suite's client-side load: one HTTP request every
// interval, each on a new connection (so every request resolves the service
// IP through the client's neighbour table and opens fresh conntrack state),
// recording when it was sent and whether it succeeded. The e2e tests and the
// failover benchmark run it on the external client (mypc) and parse its
// output with Parse.
package probe

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"
)

// DefaultInterval is Run's interval when Options.Interval is 0 (50 req/s).
const DefaultInterval = 20 * time.Millisecond

// Options configure Run.
type Options struct {
	URL      string
	Interval time.Duration // between request starts (default 20 ms)
	Timeout  time.Duration // per request (default 1 s)
	// StopFile: Run returns once this file exists (it is removed first).
	StopFile string
	// Duration bounds the run (0: until StopFile or ctx).
	Duration time.Duration
}

// Record is one request.
type Record struct {
	Sent    time.Time
	Latency time.Duration
	OK      bool
	Err     string
}

// Run sends requests until ctx ends, Duration passes or StopFile appears, and
// returns the records in send order.
func Run(ctx context.Context, o Options) []Record {
	if o.Interval <= 0 {
		o.Interval = DefaultInterval
	}
	if o.Timeout <= 0 {
		o.Timeout = time.Second
	}
	tr := &http.Transport{
		DisableKeepAlives: true,
		DialContext:       (&net.Dialer{Timeout: o.Timeout}).DialContext,
	}
	cl := &http.Client{Transport: tr, Timeout: o.Timeout}
	var (
		mu   sync.Mutex
		recs []Record
		wg   sync.WaitGroup
	)
	ctx, cancel := StopWhen(ctx, o.StopFile, o.Duration)
	defer cancel()
	every(ctx, o.Interval, func(sent time.Time) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := Record{Sent: sent}
			// The requests outlive ctx by at most Timeout: a request sent is
			// always recorded.
			resp, err := cl.Get(o.URL)
			if err == nil {
				_, err = io.Copy(io.Discard, resp.Body)
				_ = resp.Body.Close() // the body was read in full; a close error changes nothing
				if err == nil && resp.StatusCode != http.StatusOK {
					err = fmt.Errorf("HTTP %d", resp.StatusCode)
				}
			}
			r.Latency = time.Since(sent)
			r.OK = err == nil
			if err != nil {
				r.Err = err.Error()
			}
			mu.Lock()
			recs = append(recs, r)
			mu.Unlock()
		}()
	})
	wg.Wait()
	sort.Slice(recs, func(i, j int) bool { return recs[i].Sent.Before(recs[j].Sent) })
	return recs
}

// StopWhen returns a context that ends with ctx, after d (if > 0), or once
// stopFile (if set) exists. The file is removed first, so a file left by an
// earlier run is not obeyed, and again when seen, so the next run starts clean.
// The suite stops a probe on the client by creating the file: a signal would
// not cross `ip netns exec` or `docker exec`.
func StopWhen(ctx context.Context, stopFile string, d time.Duration) (context.Context, context.CancelFunc) {
	var cancel context.CancelFunc
	if d > 0 {
		ctx, cancel = context.WithTimeout(ctx, d)
	} else {
		ctx, cancel = context.WithCancel(ctx)
	}
	if stopFile == "" {
		return ctx, cancel
	}
	_ = os.Remove(stopFile) // absent is the normal case
	go func() {
		t := time.NewTicker(50 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				if _, err := os.Stat(stopFile); err == nil {
					_ = os.Remove(stopFile) // seen: the run ends either way
					cancel()
					return
				}
			}
		}
	}()
	return ctx, cancel
}

// every calls send every interval, starting at once, until ctx ends.
func every(ctx context.Context, interval time.Duration, send func(time.Time)) {
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for ctx.Err() == nil {
		send(time.Now())
		select {
		case <-ctx.Done():
		case <-tick.C:
		}
	}
}

// Write prints records one per line: "ok|fail <sent unix ns> <latency ns> [error]".
func Write(w io.Writer, recs []Record) error {
	bw := bufio.NewWriter(w)
	for _, r := range recs {
		st := "ok"
		if !r.OK {
			st = "fail"
		}
		// bufio.Writer keeps the first write error; Flush below returns it.
		_, _ = fmt.Fprintf(bw, "%s %d %d %s\n", st, r.Sent.UnixNano(), r.Latency.Nanoseconds(), strings.ReplaceAll(r.Err, "\n", " "))
	}
	return bw.Flush()
}

// Parse reads what Write printed; other lines are ignored.
func Parse(s string) []Record {
	var out []Record
	for _, line := range strings.Split(s, "\n") {
		f := strings.SplitN(strings.TrimSpace(line), " ", 4)
		if len(f) < 3 || (f[0] != "ok" && f[0] != "fail") {
			continue
		}
		sent, err1 := strconv.ParseInt(f[1], 10, 64)
		lat, err2 := strconv.ParseInt(f[2], 10, 64)
		if err1 != nil || err2 != nil {
			continue
		}
		r := Record{Sent: time.Unix(0, sent), Latency: time.Duration(lat), OK: f[0] == "ok"}
		if len(f) == 4 {
			r.Err = f[3]
		}
		out = append(out, r)
	}
	return out
}

// Summary describes a run around one disruption at time At.
type Summary struct {
	Total, Failed int
	// Recovery is the time from At to the send time of the first successful
	// request sent after the last failed one: when traffic flowed again for
	// good. 0 when no request failed. When no request sent after the last
	// failed one succeeded (Unrecovered), it is the time to that last failed
	// request: a lower bound, never 0.
	Recovery    time.Duration
	Unrecovered bool
	// FailWindow is the time between the first and the last failed request's
	// send times (plus nothing: one failure gives 0).
	FailWindow time.Duration
	// Rate is requests per second over the run.
	Rate float64
}

// Summarize computes a Summary of recs (in send order) for a disruption at at.
func Summarize(recs []Record, at time.Time) Summary {
	var s Summary
	s.Total = len(recs)
	var firstFail, lastFail time.Time
	for _, r := range recs {
		if !r.OK {
			s.Failed++
			if firstFail.IsZero() {
				firstFail = r.Sent
			}
			lastFail = r.Sent
		}
	}
	if s.Failed > 0 {
		s.FailWindow = lastFail.Sub(firstFail)
		s.Recovery, s.Unrecovered = lastFail.Sub(at), true
		for _, r := range recs {
			if r.OK && r.Sent.After(lastFail) {
				s.Recovery, s.Unrecovered = r.Sent.Sub(at), false
				break
			}
		}
	}
	if n := len(recs); n > 1 {
		if d := recs[n-1].Sent.Sub(recs[0].Sent); d > 0 {
			s.Rate = float64(n-1) / d.Seconds()
		}
	}
	return s
}
