package probe

import (
	"bytes"
	"context"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestSummarizeAndRoundTrip(t *testing.T) {
	at := time.Unix(100, 0)
	ms := func(n int) time.Time { return at.Add(time.Duration(n) * time.Millisecond) }
	recs := []Record{
		{Sent: ms(-40), OK: true},
		{Sent: ms(-20), OK: true},
		{Sent: ms(0), OK: true}, // the kill has not bitten yet
		{Sent: ms(20), Err: "timeout"},
		{Sent: ms(40), Err: "timeout"},
		{Sent: ms(60), OK: true}, // a lucky one in the middle
		{Sent: ms(80), Err: "timeout"},
		{Sent: ms(100), OK: true},
		{Sent: ms(120), OK: true},
	}
	var b bytes.Buffer
	if err := Write(&b, recs); err != nil {
		t.Fatal(err)
	}
	got := Parse(b.String() + "noise\n")
	if len(got) != len(recs) || got[3].Err != "timeout" || !got[3].Sent.Equal(recs[3].Sent) {
		t.Fatalf("round trip: %+v", got)
	}
	s := Summarize(got, at)
	if s.Total != 9 || s.Failed != 3 || s.Recovery != 100*time.Millisecond || s.FailWindow != 60*time.Millisecond {
		t.Errorf("Summarize = %+v, want 9 total, 3 failed, recovery 100ms, window 60ms", s)
	}
	if s := Summarize(recs[:3], at); s.Recovery != 0 || s.Failed != 0 {
		t.Errorf("no failures: %+v", s)
	}
	// The run ended before traffic recovered: the recovery is at least the
	// last failure, never 0.
	if s := Summarize(recs[:7], at); !s.Unrecovered || s.Recovery != 80*time.Millisecond {
		t.Errorf("not recovered: %+v, want unrecovered, recovery >= 80ms", s)
	}
}

func TestARPRoundTrip(t *testing.T) {
	mac, _ := net.ParseMAC("02:00:00:00:00:0b")
	recs := []ARPRecord{
		{At: time.Unix(100, 5), MAC: mac, Reply: false},
		{At: time.Unix(100, 20_000_000), MAC: mac, Reply: true},
		{At: time.Unix(101, 0), MAC: mac, Reply: true, NDP: true, Solicited: true, Override: true},
		{At: time.Unix(102, 0), MAC: mac, Reply: true, NDP: true, Router: true},
		{At: time.Unix(103, 0), MAC: mac, Reply: true, NDP: true},
	}
	var b bytes.Buffer
	if err := WriteARP(&b, recs); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(b.String(), " reply SO\n") || !strings.Contains(b.String(), " reply -\n") {
		t.Errorf("NDP flags not printed:\n%s", b.String())
	}
	got := ParseARP("noise\narp 1 zz reply\nndp 1 02:00:00:00:00:0b reply\n" + b.String() + "ok 1 2\n")
	if len(got) != len(recs) {
		t.Fatalf("round trip of %+v: got %+v", recs, got)
	}
	for i := range recs {
		if !got[i].At.Equal(recs[i].At) || got[i].MAC.String() != mac.String() {
			t.Errorf("record %d: got %+v, want %+v", i, got[i], recs[i])
		}
		g, w := got[i], recs[i]
		if g.Reply != w.Reply || g.NDP != w.NDP || g.Router != w.Router || g.Solicited != w.Solicited || g.Override != w.Override {
			t.Errorf("record %d: got %+v, want %+v", i, got[i], recs[i])
		}
	}
}

func TestInterfaceFor(t *testing.T) {
	ifi, err := interfaceFor("", netip.MustParseAddr("127.0.0.9"))
	if err != nil || ifi.Flags&net.FlagLoopback == 0 {
		t.Fatalf("interface for 127.0.0.9 = %v, %v; want the loopback interface", ifi, err)
	}
	// 198.51.100.0/24 is documentation space (RFC 5737), on no interface here.
	if ifi, err := interfaceFor("", netip.MustParseAddr("198.51.100.77")); err == nil || !strings.Contains(err.Error(), "198.51.100.77") {
		t.Errorf("interface for an address on no subnet: %v, err = %v, want an error naming the address", ifi, err)
	}
	if _, err := RunARP(context.Background(), ARPOptions{Target: netip.MustParseAddr("2001:db8::1")}); err == nil {
		t.Error("RunARP accepted an IPv6 target")
	}
}

func TestStopWhen(t *testing.T) {
	stop := filepath.Join(t.TempDir(), "stop")
	if err := os.WriteFile(stop, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	// A stop file left by an earlier run is removed, not obeyed; one that
	// appears during the run ends it and is removed.
	ctx, cancel := StopWhen(context.Background(), stop, 0)
	defer cancel()
	if _, err := os.Stat(stop); !os.IsNotExist(err) {
		t.Fatalf("a leftover stop file was not removed: %v", err)
	}
	n := 0
	every(ctx, time.Millisecond, func(time.Time) {
		if n++; n == 3 {
			if err := os.WriteFile(stop, nil, 0o600); err != nil {
				t.Error(err)
			}
		}
	})
	if n < 3 {
		t.Errorf("sent %d times, want at least 3", n)
	}
	if _, err := os.Stat(stop); !os.IsNotExist(err) {
		t.Errorf("stop file still there after the run: %v", err)
	}

	ctx, cancel = StopWhen(context.Background(), "", 20*time.Millisecond)
	defer cancel()
	every(ctx, time.Millisecond, func(time.Time) {})
	if ctx.Err() == nil {
		t.Error("every returned before the duration ended")
	}
	ctx, cancel = context.WithCancel(context.Background())
	cancel()
	n = 0
	every(ctx, time.Hour, func(time.Time) { n++ })
	if n != 0 {
		t.Errorf("cancelled context: sent %d times, want 0", n)
	}
}
