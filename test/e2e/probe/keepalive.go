package probe

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// KeepAliveOptions configure RunKeepAlive.
type KeepAliveOptions struct {
	URL string
	// Conns is the number of persistent connections (default 4).
	Conns int
	// Interval between the requests of one connection (default 100 ms).
	Interval time.Duration
	// Timeout bounds each dial and each request (default 2 s: a request that
	// takes longer counts as a broken connection, so it must stay well above
	// what a loaded 2-core machine adds, and it is not the failover figure).
	Timeout time.Duration
	// StopFile and Duration end the run as in Options.
	StopFile string
	Duration time.Duration
	// ReadyFile, when set, is created once every connection has completed a
	// request: the caller's cue that the connections are established.
	ReadyFile string
	// onReady, when set, is called (once) at the same moment: RunChaos
	// waits for the connections of every target.
	onReady func()
}

// How an established connection was lost.
const (
	BreakReset   = "reset"   // RST from the peer (ECONNRESET, EPIPE)
	BreakTimeout = "timeout" // no answer within the timeout
	BreakClosed  = "closed"  // orderly close (EOF) by the peer
	BreakOther   = "other"   // anything else, e.g. ICMP host unreachable
)

// Break is one established connection lost: it had to be re-dialled.
type Break struct {
	At   time.Time `json:"at"`
	Kind string    `json:"kind"`
	Err  string    `json:"err"`
	// Served is how many requests the connection had answered before.
	Served int `json:"served"`
}

// ConnReport counts one persistent connection's requests. A connection that
// breaks is re-dialled and keeps its report.
type ConnReport struct {
	ID int `json:"id"`
	// OK and Errors count requests; Errors includes failed dials (one per
	// request interval while the address cannot be reached).
	OK     int `json:"ok"`
	Errors int `json:"errors"`
	Dials  int `json:"dials"`
	// DialErrors is the part of Errors that were failed dials.
	DialErrors int `json:"dial_errors"`
	// Broken counts established connections lost, by kind below.
	Broken   int `json:"broken"`
	Resets   int `json:"resets"`
	Timeouts int `json:"timeouts"`
	Closed   int `json:"closed"`
	Other    int `json:"other"`
	// MaxGapMS is the longest time between two successful requests (from
	// the first success on): how long this client saw no answer.
	MaxGapMS float64 `json:"max_gap_ms"`
	Breaks   []Break `json:"breaks,omitempty"`
	// LastErr is the last error of any kind (dial or request).
	LastErr string `json:"last_err,omitempty"`
}

// KeepAliveReport is the result of RunKeepAlive: per connection and totals.
type KeepAliveReport struct {
	IntervalMS float64      `json:"interval_ms"`
	Conns      []ConnReport `json:"conns"`
	OK         int          `json:"ok"`
	Errors     int          `json:"errors"`
	Broken     int          `json:"broken"`
	// MaxBrokenPerConn is the most breaks any one connection had.
	MaxBrokenPerConn int     `json:"max_broken_per_conn"`
	MaxGapMS         float64 `json:"max_gap_ms"`
}

// RunKeepAlive keeps Conns HTTP/1.1 connections to the URL's host open and
// sends one request on each every Interval, as a long-lived client (a
// database pool, a streaming consumer) would, until ctx ends, Duration passes
// or StopFile appears. A connection that is reset, closed or times out is
// counted as broken and dialled again at the next interval. Unlike Run, which
// opens a new connection per request, this sees what happens to established
// connections: whether their packets still reach the node that holds their
// conntrack state.
func RunKeepAlive(ctx context.Context, o KeepAliveOptions) (KeepAliveReport, error) {
	if o.Conns <= 0 {
		o.Conns = 4
	}
	if o.Interval <= 0 {
		o.Interval = 100 * time.Millisecond
	}
	if o.Timeout <= 0 {
		o.Timeout = 2 * time.Second
	}
	u, err := url.Parse(o.URL)
	if err != nil || u.Scheme != "http" || u.Host == "" {
		return KeepAliveReport{}, fmt.Errorf("keep-alive URL %q: want http://host[:port]/path", o.URL)
	}
	addr := u.Host
	if u.Port() == "" {
		addr = net.JoinHostPort(u.Hostname(), "80")
	}
	ctx, cancel := StopWhen(ctx, o.StopFile, o.Duration)
	defer cancel()

	conns := make([]*kaConn, o.Conns)
	var pending atomic.Int32
	pending.Store(int32(o.Conns))
	ready := func() {
		if pending.Add(-1) != 0 {
			return
		}
		if o.ReadyFile != "" {
			_ = os.WriteFile(o.ReadyFile, nil, 0o644) // the caller times out waiting for it and says so
		}
		if o.onReady != nil {
			o.onReady()
		}
	}
	for i := range conns {
		conns[i] = &kaConn{o: o, addr: addr, url: u, rep: ConnReport{ID: i}, ready: ready}
	}
	var wg sync.WaitGroup
	for i, c := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// Spread the connections over the interval.
			select {
			case <-ctx.Done():
				return
			case <-time.After(time.Duration(i) * o.Interval / time.Duration(o.Conns)):
			}
			every(ctx, o.Interval, func(time.Time) { c.tick() })
			c.close()
		}()
	}
	wg.Wait()

	rep := KeepAliveReport{IntervalMS: ms(o.Interval)}
	for _, c := range conns {
		r := c.rep
		rep.Conns = append(rep.Conns, r)
		rep.OK += r.OK
		rep.Errors += r.Errors
		rep.Broken += r.Broken
		rep.MaxBrokenPerConn = max(rep.MaxBrokenPerConn, r.Broken)
		rep.MaxGapMS = max(rep.MaxGapMS, r.MaxGapMS)
	}
	return rep, nil
}

// kaConn is one persistent connection; only its own goroutine touches it.
type kaConn struct {
	o     KeepAliveOptions
	addr  string
	url   *url.URL
	rep   ConnReport
	ready func() // called after the first successful request

	conn   net.Conn
	br     *bufio.Reader
	served int // requests answered on the current connection
	lastOK time.Time
}

// tick sends one request, dialling first if there is no connection.
func (c *kaConn) tick() {
	if c.conn == nil {
		c.rep.Dials++
		conn, err := net.DialTimeout("tcp", c.addr, c.o.Timeout)
		if err != nil {
			c.rep.Errors++
			c.rep.DialErrors++
			c.rep.LastErr = err.Error()
			return
		}
		c.conn, c.br, c.served = conn, bufio.NewReader(conn), 0
	}
	closing, err := c.request()
	if err != nil {
		c.rep.Errors++
		c.rep.LastErr = err.Error()
		var se statusError
		if errors.As(err, &se) {
			return // an answer: the connection is fine
		}
		c.lost(BreakKind(err), err)
		return
	}
	now := time.Now()
	if !c.lastOK.IsZero() {
		c.rep.MaxGapMS = max(c.rep.MaxGapMS, ms(now.Sub(c.lastOK)))
	}
	if c.rep.OK == 0 {
		c.ready()
	}
	c.lastOK = now
	c.rep.OK++
	c.served++
	if closing {
		c.lost(BreakClosed, errors.New("the server answered Connection: close"))
	}
}

type statusError int

func (s statusError) Error() string { return fmt.Sprintf("HTTP %d", int(s)) }

// request sends one GET on the connection and reads the whole answer;
// closing reports that the server will close the connection after it.
func (c *kaConn) request() (closing bool, err error) {
	if err := c.conn.SetDeadline(time.Now().Add(c.o.Timeout)); err != nil {
		return false, err
	}
	req := &http.Request{Method: http.MethodGet, URL: c.url, Host: c.url.Host, Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header: http.Header{"User-Agent": {"e2e-probe keep-alive"}}}
	if err := req.Write(c.conn); err != nil {
		return false, err
	}
	resp, err := http.ReadResponse(c.br, req)
	if err != nil {
		return false, err
	}
	_, err = io.Copy(io.Discard, resp.Body)
	_ = resp.Body.Close() // read in full above; the read error is the one that counts
	if err != nil {
		return false, err
	}
	if resp.StatusCode != http.StatusOK {
		return resp.Close, statusError(resp.StatusCode)
	}
	return resp.Close, nil
}

// lost records the loss of the established connection and drops it.
func (c *kaConn) lost(kind string, err error) {
	c.rep.Broken++
	switch kind {
	case BreakReset:
		c.rep.Resets++
	case BreakTimeout:
		c.rep.Timeouts++
	case BreakClosed:
		c.rep.Closed++
	default:
		c.rep.Other++
	}
	c.rep.Breaks = append(c.rep.Breaks, Break{At: time.Now(), Kind: kind, Err: err.Error(), Served: c.served})
	c.close()
}

func (c *kaConn) close() {
	if c.conn != nil {
		_ = c.conn.Close() // lost or finished: nothing to flush
		c.conn, c.br = nil, nil
	}
}

// BreakKind classifies the error that ended an established connection.
func BreakKind(err error) string {
	var ne net.Error
	switch {
	case errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.EPIPE), errors.Is(err, syscall.ECONNABORTED):
		return BreakReset
	case errors.Is(err, os.ErrDeadlineExceeded), errors.As(err, &ne) && ne.Timeout():
		return BreakTimeout
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return BreakClosed
	}
	return BreakOther
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
