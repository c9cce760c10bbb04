package probe

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// breakingServer answers every request, except that the 4th request it
// receives is answered by breaking its connection the way mode says (once).
func breakingServer(t *testing.T, mode string) *httptest.Server {
	var n atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if n.Add(1) != 4 {
			_, _ = io.WriteString(w, "Hostname: test\n")
			return
		}
		switch mode {
		case BreakReset, BreakClosed:
			conn, _, err := w.(http.Hijacker).Hijack()
			if err != nil {
				t.Error(err)
				return
			}
			if mode == BreakReset {
				// Linger 0: close sends RST, as a node without the
				// connection's state does.
				_ = conn.(*net.TCPConn).SetLinger(0)
			}
			_ = conn.Close()
		case BreakTimeout:
			<-r.Context().Done() // the client gives up and closes
		case "connection-close":
			w.Header().Set("Connection", "close")
			_, _ = io.WriteString(w, "bye\n")
		case "status":
			w.WriteHeader(http.StatusServiceUnavailable)
		}
	}))
	t.Cleanup(srv.Close)
	return srv
}

func TestRunKeepAlive(t *testing.T) {
	for _, c := range []struct {
		mode       string
		wantKind   string // "" : no break
		wantErrors int
	}{
		{mode: "none"},
		{mode: BreakReset, wantKind: BreakReset, wantErrors: 1},
		{mode: BreakClosed, wantKind: BreakClosed, wantErrors: 1},
		{mode: BreakTimeout, wantKind: BreakTimeout, wantErrors: 1},
		{mode: "connection-close", wantKind: BreakClosed},
		{mode: "status", wantErrors: 1}, // an answer: counted as an error, the connection lives on
	} {
		t.Run(c.mode, func(t *testing.T) {
			srv := breakingServer(t, c.mode)
			ready := filepath.Join(t.TempDir(), "ready")
			rep, err := RunKeepAlive(context.Background(), KeepAliveOptions{
				URL: srv.URL + "/", Conns: 2, Interval: 10 * time.Millisecond, Timeout: 300 * time.Millisecond,
				Duration: 500 * time.Millisecond, ReadyFile: ready,
			})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := os.Stat(ready); err != nil {
				t.Errorf("ready file not created: %v", err)
			}
			wantBroken := 0
			if c.wantKind != "" {
				wantBroken = 1
			}
			if len(rep.Conns) != 2 || rep.Broken != wantBroken || rep.Errors != c.wantErrors || rep.OK < 20 {
				t.Fatalf("report %+v: want 2 connections, %d broken, %d errors, >= 20 ok", rep, wantBroken, c.wantErrors)
			}
			for _, conn := range rep.Conns {
				if conn.Broken == 0 {
					if conn.Dials != 1 {
						t.Errorf("conn %d: not broken but dialled %d times", conn.ID, conn.Dials)
					}
					continue
				}
				b := conn.Breaks[0]
				if b.Kind != c.wantKind || conn.Dials != 2 {
					t.Errorf("conn %d: break %+v after %d dials, want kind %s and one re-dial", conn.ID, b, conn.Dials, c.wantKind)
				}
				kinds := map[string]int{BreakReset: conn.Resets, BreakTimeout: conn.Timeouts, BreakClosed: conn.Closed, BreakOther: conn.Other}
				if kinds[c.wantKind] != 1 {
					t.Errorf("conn %d: counters %+v, want one %s", conn.ID, conn, c.wantKind)
				}
			}
			if rep.MaxBrokenPerConn != wantBroken {
				t.Errorf("most breaks on one connection %d, want %d", rep.MaxBrokenPerConn, wantBroken)
			}
		})
	}
}

func TestRunKeepAliveUnreachable(t *testing.T) {
	// A port nothing listens on: every dial fails, nothing is "broken"
	// (no connection was ever established), the ready file never appears.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	_ = l.Close()
	ready := filepath.Join(t.TempDir(), "ready")
	rep, err := RunKeepAlive(context.Background(), KeepAliveOptions{URL: "http://" + addr + "/", Conns: 1, Interval: 10 * time.Millisecond, Duration: 200 * time.Millisecond, ReadyFile: ready})
	if err != nil {
		t.Fatal(err)
	}
	c := rep.Conns[0]
	if c.OK != 0 || c.Broken != 0 || c.DialErrors == 0 || c.Errors != c.DialErrors || !strings.Contains(c.LastErr, "refused") {
		t.Errorf("report %+v: want only refused dials", c)
	}
	if _, err := os.Stat(ready); !os.IsNotExist(err) {
		t.Errorf("ready file created although no connection answered: %v", err)
	}
	if _, err := RunKeepAlive(context.Background(), KeepAliveOptions{URL: "https://x/"}); err == nil || !strings.Contains(err.Error(), "https://x/") {
		t.Errorf("an https URL: err %v, want one naming the URL", err)
	}
}

func TestBreakKind(t *testing.T) {
	for _, c := range []struct {
		err  error
		want string
	}{
		{&net.OpError{Op: "read", Err: os.NewSyscallError("read", syscall.ECONNRESET)}, BreakReset},
		{fmt.Errorf("write: %w", syscall.EPIPE), BreakReset},
		{&net.OpError{Op: "read", Err: os.ErrDeadlineExceeded}, BreakTimeout},
		{io.ErrUnexpectedEOF, BreakClosed},
		{fmt.Errorf("reading response: %w", io.EOF), BreakClosed},
		{&net.OpError{Op: "read", Err: os.NewSyscallError("read", syscall.EHOSTUNREACH)}, BreakOther},
		{errors.New("malformed HTTP response"), BreakOther},
	} {
		if got := BreakKind(c.err); got != c.want {
			t.Errorf("BreakKind(%v) = %s, want %s", c.err, got, c.want)
		}
	}
}

func TestReportRoundTripAndNewConns(t *testing.T) {
	at := time.Unix(100, 0)
	ms := func(n int) time.Time { return at.Add(time.Duration(n) * time.Millisecond) }
	recs := []Record{
		{Sent: ms(0), OK: true},
		{Sent: ms(20), Err: "dial tcp: i/o timeout"},
		{Sent: ms(40), OK: true},
		{Sent: ms(60), Err: "connection refused"},
		{Sent: ms(80), OK: true},
		{Sent: ms(100), OK: true},
	}
	n := SummarizeNewConns(recs, 20*time.Millisecond)
	if n.Total != 6 || n.Failed != 2 || !n.FirstFailed.Equal(ms(20)) || !n.LastFailed.Equal(ms(60)) || !n.Resumed.Equal(ms(80)) || len(n.Failures) != 2 {
		t.Fatalf("SummarizeNewConns = %+v", n)
	}
	if got := n.Recovery(ms(10)); got != 70*time.Millisecond {
		t.Errorf("Recovery = %v, want 70ms", got)
	}
	rep := Report{Start: at, End: ms(100), NewConns: n, KeepAlive: &KeepAliveReport{Conns: []ConnReport{{ID: 0, OK: 5, Broken: 1, Resets: 1,
		Breaks: []Break{{At: ms(30), Kind: BreakReset, Err: "read: connection reset by peer", Served: 3}}}}, OK: 5, Broken: 1, MaxBrokenPerConn: 1}}
	var b strings.Builder
	if err := WriteReport(&b, rep); err != nil {
		t.Fatal(err)
	}
	got, err := ParseReport("noise\n" + b.String())
	if err != nil {
		t.Fatal(err)
	}
	if got.KeepAlive.Conns[0].Breaks[0].Kind != BreakReset || !got.NewConns.Resumed.Equal(ms(80)) || !got.Start.Equal(at) {
		t.Errorf("round trip: %+v", got)
	}
	if s := got.String(); !strings.Contains(s, "1 broken") || !strings.Contains(s, "2 of 6 failed") || !strings.Contains(s, "conn 0 broken") {
		t.Errorf("String() = %s", s)
	}
	if _, err := ParseReport("ok 1 2\n"); err == nil {
		t.Error("ParseReport accepted output without a summary")
	}
}
