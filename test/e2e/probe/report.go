package probe

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"time"
)

// Report is e2e-probe's JSON summary of a run with persistent connections
// and, usually, the new-connection probe beside them.
type Report struct {
	Start     time.Time        `json:"start"`
	End       time.Time        `json:"end"`
	KeepAlive *KeepAliveReport `json:"keepalive,omitempty"`
	NewConns  *NewConnReport   `json:"new_conns,omitempty"`
}

// NewConnReport summarizes Run's records (one request per new connection).
type NewConnReport struct {
	IntervalMS float64 `json:"interval_ms"`
	Total      int     `json:"total"`
	Failed     int     `json:"failed"`
	Rate       float64 `json:"rate_per_s"`
	// FirstFailed and LastFailed are the send times of the first and last
	// failed requests; Resumed is the send time of the first successful
	// request after the last failure (zero when none failed).
	FirstFailed time.Time `json:"first_failed,omitzero"`
	LastFailed  time.Time `json:"last_failed,omitzero"`
	Resumed     time.Time `json:"resumed,omitzero"`
	// Failures lists the first failed requests: send time and error.
	Failures []string `json:"failures,omitempty"`
}

// maxFailuresListed bounds NewConnReport.Failures (a failover fails ~50).
const maxFailuresListed = 100

// SummarizeNewConns builds the NewConnReport of recs (in send order).
func SummarizeNewConns(recs []Record, interval time.Duration) *NewConnReport {
	s := Summarize(recs, time.Time{})
	r := &NewConnReport{IntervalMS: ms(interval), Total: s.Total, Failed: s.Failed, Rate: s.Rate}
	for _, rec := range recs {
		switch {
		case !rec.OK:
			if r.FirstFailed.IsZero() {
				r.FirstFailed = rec.Sent
			}
			r.LastFailed, r.Resumed = rec.Sent, time.Time{}
			if len(r.Failures) < maxFailuresListed {
				r.Failures = append(r.Failures, rec.Sent.Format("15:04:05.000")+" "+rec.Err)
			}
		case !r.LastFailed.IsZero() && r.Resumed.IsZero():
			r.Resumed = rec.Sent
		}
	}
	return r
}

// Recovery is the time from at to Resumed: when new connections worked again
// for good after a disruption at at (0 when none failed or none succeeded after).
func (r *NewConnReport) Recovery(at time.Time) time.Duration {
	if r == nil || r.Resumed.IsZero() {
		return 0
	}
	return r.Resumed.Sub(at)
}

// WriteReport prints r as one line of JSON.
func WriteReport(w io.Writer, r Report) error { return json.NewEncoder(w).Encode(r) }

// ParseReport reads the JSON summary from e2e-probe's output (the last line
// that starts with '{'; other lines are ignored).
func ParseReport(out string) (Report, error) {
	lines := strings.Split(strings.TrimSpace(out), "\n")
	for i := len(lines) - 1; i >= 0; i-- {
		if l := strings.TrimSpace(lines[i]); strings.HasPrefix(l, "{") {
			var r Report
			if err := json.Unmarshal([]byte(l), &r); err != nil {
				return Report{}, fmt.Errorf("e2e-probe summary %q: %w", l, err)
			}
			return r, nil
		}
	}
	return Report{}, fmt.Errorf("no JSON summary in e2e-probe's output %q", out)
}

// String is a one-line account of the report for test logs.
func (r Report) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%.1fs", r.End.Sub(r.Start).Seconds())
	if k := r.KeepAlive; k != nil {
		fmt.Fprintf(&b, "; %d keep-alive connections: %d ok, %d errors, %d broken (most on one connection %d), longest gap %.0f ms",
			len(k.Conns), k.OK, k.Errors, k.Broken, k.MaxBrokenPerConn, k.MaxGapMS)
		for _, c := range k.Conns {
			for _, br := range c.Breaks {
				fmt.Fprintf(&b, "\n  conn %d broken at %s (%s after %d requests): %s", c.ID, br.At.Format("15:04:05.000"), br.Kind, br.Served, br.Err)
			}
		}
	}
	if n := r.NewConns; n != nil {
		fmt.Fprintf(&b, "\n  new connections: %d of %d failed at %.1f req/s", n.Failed, n.Total, n.Rate)
		if n.Failed > 0 {
			fmt.Fprintf(&b, " (sent %s..%s, first success after %s)", n.FirstFailed.Format("15:04:05.000"), n.LastFailed.Format("15:04:05.000"), fmtTime(n.Resumed))
		}
	}
	return b.String()
}

func fmtTime(t time.Time) string {
	if t.IsZero() {
		return "never"
	}
	return t.Format("15:04:05.000")
}
