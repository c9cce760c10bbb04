package probe

import (
	"bytes"
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
}
