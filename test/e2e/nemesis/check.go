package nemesis

import (
	"fmt"
	"slices"
	"strings"
	"time"
)

// Applied is a fault as the driver applied it: the plan and the wall-clock
// times it really started and healed (End = Start for an instant fault).
type Applied struct {
	Fault
	Episode    int
	Start, End time.Time
}

// ARPSample is one ARP reply or announcement (or NDP advertisement) for an
// IP, as a client received it.
type ARPSample struct {
	At  time.Time
	IP  string
	MAC string
	// Client is the host that heard it ("" when there is one client).
	Client string
}

// Event is something that happened to one IP at a time: a keep-alive
// connection broken, a new connection failed (OK false) or succeeded, an
// owner reported by ServiceL2Status (Node).
type Event struct {
	At   time.Time
	IP   string
	OK   bool
	Node string
}

// Observations are what the checker judges: the client's records and the
// faults applied.
type Observations struct {
	// Nodes are the cluster's nodes (the majority is of these).
	Nodes []string
	// IPs are the Service IPs the client asked for.
	IPs []string
	// ARPStart and ARPEnd bound the time every client asked for every IP,
	// once every ARPInterval: a bucket of that length in which a client
	// heard no answer is an IP nobody answered (for that client). Two MACs,
	// moves and convergence are judged on what all clients heard together.
	ARPStart, ARPEnd time.Time
	ARPInterval      time.Duration
	ARP              []ARPSample
	// MACNode names the node of each MAC (lower case, colon-separated).
	MACNode map[string]string
	// Breaks are keep-alive connections lost, NewConns every new
	// connection tried, Owners the announcers ServiceL2Status reported.
	Breaks, NewConns, Owners []Event
	Faults                   []Applied
}

// Limits are issue 25's targets and the checker's tolerances.
type Limits struct {
	// Overlap bounds a dual-answer interval (default 1 s).
	Overlap time.Duration
	// Answer bounds an interval nobody answers an IP during a single fault
	// that leaves a majority up (default 1 s).
	Answer time.Duration
	// Converge bounds the time from the last heal of an episode until every
	// IP is answered by one MAC for good (default 2 s).
	Converge time.Duration
	// Grace is how long before a move the previous owner's data path may
	// have been down for the move to count as needed: the failure
	// detector's latency (default 2 s).
	Grace time.Duration
	// LostReplies is the longest run of unanswered buckets that convergence
	// ignores as lost replies rather than an IP nobody answers (default 2).
	LostReplies int
}

func (l Limits) withDefaults() Limits {
	if l.Overlap <= 0 {
		l.Overlap = time.Second
	}
	if l.Answer <= 0 {
		l.Answer = time.Second
	}
	if l.Converge <= 0 {
		l.Converge = 2 * time.Second
	}
	if l.Grace <= 0 {
		l.Grace = 2 * time.Second
	}
	if l.LostReplies <= 0 {
		l.LostReplies = 2
	}
	return l
}

// Interval is a time one IP was answered by two or more MACs, or by none.
type Interval struct {
	IP       string
	From, To time.Time
	MACs     []string
	// Client is the host that heard no answer ("" for a dual answer, heard
	// by the clients together, and when there is one client).
	Client string
}

// where names the client of a no-answer interval, if there are several.
func (iv Interval) where() string {
	if iv.Client == "" {
		return ""
	}
	return " at " + iv.Client
}

// Duration is the interval's length.
func (iv Interval) Duration() time.Duration { return iv.To.Sub(iv.From) }

// Move is a change of the MAC (node) answering an IP.
type Move struct {
	IP       string
	At       time.Time
	From, To string // nodes
	// Needless: From's data path was up from Grace before the move to the move.
	Needless bool
}

func (m Move) String() string {
	s := fmt.Sprintf("%s %s: %s -> %s", m.At.Format("15:04:05.000"), m.IP, m.From, m.To)
	if m.Needless {
		s += " NEEDLESS (" + m.From + "'s data path was up)"
	}
	return s
}

// Window is the checker's account of one episode (or of the baseline before
// the first): what happened from its first fault's start until the next
// episode's.
type Window struct {
	Episode  int // 0: the baseline
	Faults   []Applied
	From, To time.Time
	// Heal is when its last fault ended.
	Heal time.Time
	// Single: one fault; MajorityUp: it leaves a majority of the nodes
	// unimpaired, so every IP must stay answered.
	Single, MajorityUp   bool
	Dual, None           []Interval
	Moves, StatusMoves   []Move
	Breaks               int
	NewConns, FailedNew  int
	Convergence          time.Duration
	Converged            bool
	LongestDual          time.Duration
	LongestNone          time.Duration
	NeedlessMoves        int
	NeedlessStatusMoves  int
	unconvergedIPs       []string
	convergenceByIP      map[string]time.Duration
	longestNoneByIP      map[string]time.Duration
	longestNoneIntervals map[string]Interval
}

// Report is the checker's verdict.
type Report struct {
	Limits  Limits
	Windows []Window
	// Violations are the targets missed, one line each (empty: passed).
	Violations []string
}

// Check judges the observations against the schedule's truth.
func Check(obs Observations, l Limits) Report {
	l = l.withDefaults()
	rep := Report{Limits: l}
	wins := windows(obs)
	iv := obs.ARPInterval
	if iv <= 0 {
		iv = 100 * time.Millisecond
	}
	nb := 0
	if obs.ARPEnd.After(obs.ARPStart) {
		nb = int(obs.ARPEnd.Sub(obs.ARPStart) / iv)
	}
	bucketStart := func(b int) time.Time { return obs.ARPStart.Add(time.Duration(b) * iv) }
	nodeOf := func(mac string) string {
		if n, ok := obs.MACNode[strings.ToLower(mac)]; ok {
			return n
		}
		return "unknown MAC " + mac
	}
	winOf := func(at time.Time) *Window {
		for i := len(wins) - 1; i >= 0; i-- {
			if !at.Before(wins[i].From) {
				return &wins[i]
			}
		}
		return &wins[0]
	}
	// bucketWin is the window of something first heard in the bucket
	// starting at start: the one in force at the bucket's end, so that an
	// interval or move caused by a fault that started within the bucket
	// is the fault's.
	bucketWin := func(start time.Time) *Window { return winOf(start.Add(iv - 1)) }
	// downNear: node's data path was down at some time in [at-Grace, at].
	downNear := func(node string, at time.Time) bool {
		for _, f := range obs.Faults {
			if slices.Contains(f.DataPathDown, node) && !f.Start.After(at) && !f.End.Before(at.Add(-l.Grace)) {
				return true
			}
		}
		return false
	}

	var clients []string
	for _, s := range obs.ARP {
		if !slices.Contains(clients, s.Client) {
			clients = append(clients, s.Client)
		}
	}
	slices.Sort(clients)
	for _, ip := range obs.IPs {
		// The MACs each client heard in each bucket, and all clients together.
		heard := map[string][][]string{}
		for _, c := range clients {
			heard[c] = make([][]string, nb)
		}
		sets := make([][]string, nb)
		for _, s := range obs.ARP {
			if s.IP != ip || s.At.Before(obs.ARPStart) {
				continue
			}
			b := int(s.At.Sub(obs.ARPStart) / iv)
			if b >= nb {
				continue
			}
			mac := strings.ToLower(s.MAC)
			if !slices.Contains(sets[b], mac) {
				sets[b] = append(sets[b], mac)
			}
			if h := heard[s.Client]; !slices.Contains(h[b], mac) {
				h[b] = append(h[b], mac)
			}
		}
		// Dual and none runs.
		runs := func(sets [][]string, client string, match func([]string) bool, add func(w *Window, in Interval)) {
			for b := 0; b < nb; {
				if !match(sets[b]) {
					b++
					continue
				}
				e := b
				var macs []string
				for e < nb && match(sets[e]) {
					for _, m := range sets[e] {
						if !slices.Contains(macs, m) {
							macs = append(macs, m)
						}
					}
					e++
				}
				slices.Sort(macs)
				in := Interval{IP: ip, From: bucketStart(b), To: bucketStart(e), MACs: macs, Client: client}
				add(bucketWin(in.From), in)
				b = e
			}
		}
		runs(sets, "", func(s []string) bool { return len(s) >= 2 }, func(w *Window, in Interval) {
			w.Dual = append(w.Dual, in)
			w.LongestDual = max(w.LongestDual, in.Duration())
		})
		// An IP is unanswered for a client that hears no answer, whatever
		// the other clients hear.
		for _, c := range clients {
			runs(heard[c], c, func(s []string) bool { return len(s) == 0 }, func(w *Window, in Interval) {
				w.None = append(w.None, in)
				w.LongestNone = max(w.LongestNone, in.Duration())
				if in.Duration() > w.longestNoneByIP[ip] {
					w.longestNoneByIP[ip] = in.Duration()
					w.longestNoneIntervals[ip] = in
				}
			})
		}
		// Moves: changes between buckets answered by one MAC; the move is
		// when the new MAC was first heard after the old one's last lone
		// answer.
		last, lastB := "", -1
		for b := 0; b < nb; b++ {
			if len(sets[b]) != 1 {
				continue
			}
			mac := sets[b][0]
			if last != "" && mac != last {
				at := bucketStart(b)
				for k := lastB + 1; k <= b; k++ {
					if slices.Contains(sets[k], mac) {
						at = bucketStart(k)
						break
					}
				}
				m := Move{IP: ip, At: at, From: nodeOf(last), To: nodeOf(mac)}
				m.Needless = !downNear(m.From, at)
				w := bucketWin(at)
				w.Moves = append(w.Moves, m)
				if m.Needless {
					w.NeedlessMoves++
				}
			}
			last, lastB = mac, b
		}
		// Convergence after each episode's heal.
		for wi := range wins {
			w := &wins[wi]
			if w.Episode == 0 {
				continue
			}
			first := max(0, int(w.Heal.Sub(obs.ARPStart)/iv))
			end := min(nb, int(w.To.Sub(obs.ARPStart)/iv))
			if first >= end {
				w.unconvergedIPs = append(w.unconvergedIPs, ip+" (not probed after the heal)")
				continue
			}
			var final []string
			for b := end - 1; b >= first; b-- {
				if len(sets[b]) > 0 {
					final = sets[b]
					break
				}
			}
			if len(final) != 1 {
				w.unconvergedIPs = append(w.unconvergedIPs, fmt.Sprintf("%s (answered by %v at the end)", ip, final))
				continue
			}
			badEnd := w.Heal
			empty := 0
			for b := first; b < end; b++ {
				switch {
				case len(sets[b]) == 0:
					empty++
					if empty > l.LostReplies {
						badEnd = bucketStart(b + 1)
					}
				case len(sets[b]) != 1 || sets[b][0] != final[0]:
					empty = 0
					badEnd = bucketStart(b + 1)
				default:
					empty = 0
				}
			}
			if badEnd.Equal(bucketStart(end)) {
				w.unconvergedIPs = append(w.unconvergedIPs, fmt.Sprintf("%s (still changing at the end of the window)", ip))
				continue
			}
			c := max(0, badEnd.Sub(w.Heal))
			w.convergenceByIP[ip] = c
			w.Convergence = max(w.Convergence, c)
		}
	}
	// ServiceL2Status moves.
	byIP := map[string][]Event{}
	for _, ev := range obs.Owners {
		byIP[ev.IP] = append(byIP[ev.IP], ev)
	}
	for _, ip := range obs.IPs {
		evs := byIP[ip]
		slices.SortStableFunc(evs, func(a, b Event) int { return a.At.Compare(b.At) })
		last := ""
		for _, ev := range evs {
			if ev.Node == "" || ev.Node == last {
				continue
			}
			if last != "" {
				m := Move{IP: ip, At: ev.At, From: last, To: ev.Node, Needless: !downNear(last, ev.At)}
				w := winOf(ev.At)
				w.StatusMoves = append(w.StatusMoves, m)
				if m.Needless {
					w.NeedlessStatusMoves++
				}
			}
			last = ev.Node
		}
	}
	for _, ev := range obs.Breaks {
		winOf(ev.At).Breaks++
	}
	for _, ev := range obs.NewConns {
		w := winOf(ev.At)
		w.NewConns++
		if !ev.OK {
			w.FailedNew++
		}
	}
	for i := range wins {
		w := &wins[i]
		w.Converged = w.Episode != 0 && len(w.unconvergedIPs) == 0
		rep.Violations = append(rep.Violations, w.violations(l)...)
	}
	rep.Windows = wins
	return rep
}

// windows cuts the observation into the baseline and one window per
// episode, from its first fault's start to the next episode's.
func windows(obs Observations) []Window {
	newWin := func(ep int) Window {
		return Window{Episode: ep, convergenceByIP: map[string]time.Duration{}, longestNoneByIP: map[string]time.Duration{},
			longestNoneIntervals: map[string]Interval{}}
	}
	byEp := map[int][]Applied{}
	var eps []int
	for _, f := range obs.Faults {
		if _, ok := byEp[f.Episode]; !ok {
			eps = append(eps, f.Episode)
		}
		byEp[f.Episode] = append(byEp[f.Episode], f)
	}
	slices.SortFunc(eps, func(a, b int) int { return byEp[a][0].Start.Compare(byEp[b][0].Start) })
	base := newWin(0)
	base.From = obs.ARPStart
	out := []Window{base}
	for _, ep := range eps {
		w := newWin(ep)
		w.Faults = byEp[ep]
		w.From = w.Faults[0].Start
		var impaired []string
		for _, f := range w.Faults {
			w.From = minTime(w.From, f.Start)
			if f.End.After(w.Heal) {
				w.Heal = f.End
			}
			for _, n := range f.Impaired {
				if !slices.Contains(impaired, n) {
					impaired = append(impaired, n)
				}
			}
		}
		w.Single = len(w.Faults) == 1
		w.MajorityUp = 2*(len(obs.Nodes)-len(impaired)) > len(obs.Nodes)
		out = append(out, w)
	}
	for i := range out {
		if i+1 < len(out) {
			out[i].To = out[i+1].From
		} else {
			out[i].To = obs.ARPEnd
		}
	}
	if len(out) > 1 {
		out[0].To = out[1].From
	}
	return out
}

func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

// violations lists the targets the window misses.
func (w *Window) violations(l Limits) []string {
	var out []string
	name := w.name()
	for _, m := range w.Moves {
		if m.Needless {
			out = append(out, fmt.Sprintf("%s: needless move %s", name, m))
		}
	}
	for _, d := range w.Dual {
		if d.Duration() > l.Overlap {
			out = append(out, fmt.Sprintf("%s: %s answered by %d MACs %v for %v (%s-%s), bound %v", name, d.IP, len(d.MACs), d.MACs,
				d.Duration(), d.From.Format("15:04:05.000"), d.To.Format("15:04:05.000"), l.Overlap))
		}
	}
	if w.Episode != 0 && w.Single && w.MajorityUp {
		for _, ip := range slices.Sorted(mapsKeys(w.longestNoneIntervals)) {
			in := w.longestNoneIntervals[ip]
			if in.Duration() > l.Answer {
				out = append(out, fmt.Sprintf("%s: %s answered by nobody%s for %v (%s-%s) under a single fault that leaves a majority up, bound %v",
					name, ip, in.where(), in.Duration(), in.From.Format("15:04:05.000"), in.To.Format("15:04:05.000"), l.Answer))
			}
		}
	}
	if w.Episode == 0 {
		for _, in := range w.None {
			if in.Duration() > l.Answer {
				out = append(out, fmt.Sprintf("%s: %s answered by nobody%s for %v (%s-%s) with no fault", name, in.IP, in.where(), in.Duration(),
					in.From.Format("15:04:05.000"), in.To.Format("15:04:05.000")))
			}
		}
	}
	if w.Episode != 0 {
		for _, u := range w.unconvergedIPs {
			out = append(out, fmt.Sprintf("%s: not converged after the heal: %s", name, u))
		}
		for _, ip := range slices.Sorted(mapsKeys(w.convergenceByIP)) {
			if c := w.convergenceByIP[ip]; c > l.Converge {
				out = append(out, fmt.Sprintf("%s: %s converged %v after the heal, bound %v", name, ip, c, l.Converge))
			}
		}
	}
	return out
}

func mapsKeys[V any](m map[string]V) func(func(string) bool) {
	return func(yield func(string) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

func (w *Window) name() string {
	if w.Episode == 0 {
		return "baseline"
	}
	var fs []string
	for _, f := range w.Faults {
		s := string(f.Kind)
		if len(f.Nodes) > 0 {
			s += " " + strings.Join(f.Nodes, ",")
		}
		fs = append(fs, s)
	}
	return fmt.Sprintf("episode %d (%s)", w.Episode, strings.Join(fs, " + "))
}

// String prints the report: one block per window, then the verdict.
func (r Report) String() string {
	var b strings.Builder
	var moves, needless, statusMoves, needlessStatus, dualLong, breaks, failed, total int
	var longestDual, worstConv time.Duration
	for _, w := range r.Windows {
		fmt.Fprintf(&b, "%s [%s-%s]", w.name(), w.From.Format("15:04:05.000"), w.To.Format("15:04:05.000"))
		if w.Episode != 0 {
			shape := "two faults"
			if w.Single {
				shape = "single fault"
			}
			maj := "no majority up"
			if w.MajorityUp {
				maj = "majority up"
			}
			fmt.Fprintf(&b, " %s, %s, healed %s", shape, maj, w.Heal.Format("15:04:05.000"))
			for _, f := range w.Faults {
				fmt.Fprintf(&b, "\n    %s: %s-%s", f.Fault, f.Start.Format("15:04:05.000"), f.End.Format("15:04:05.000"))
			}
		}
		conv := "-"
		if w.Episode != 0 {
			conv = "NOT CONVERGED"
			if w.Converged {
				conv = w.Convergence.Round(time.Millisecond).String()
			}
		}
		fmt.Fprintf(&b, "\n  moves %d (needless %d), ServiceL2Status moves %d (needless %d), dual-answer intervals %d (longest %v), no-answer intervals %d (longest %v), broken keep-alive %d, failed new connections %d/%d, convergence %s\n",
			len(w.Moves), w.NeedlessMoves, len(w.StatusMoves), w.NeedlessStatusMoves, len(w.Dual), w.LongestDual, len(w.None), w.LongestNone,
			w.Breaks, w.FailedNew, w.NewConns, conv)
		for _, m := range w.Moves {
			fmt.Fprintf(&b, "    move %s\n", m)
		}
		for _, m := range w.StatusMoves {
			fmt.Fprintf(&b, "    ServiceL2Status move %s\n", m)
		}
		for _, d := range w.Dual {
			if d.Duration() > r.Limits.Overlap/4 {
				fmt.Fprintf(&b, "    dual %s %v %s-%s (%v)\n", d.IP, d.MACs, d.From.Format("15:04:05.000"), d.To.Format("15:04:05.000"), d.Duration())
			}
		}
		for _, ip := range slices.Sorted(mapsKeys(w.longestNoneIntervals)) {
			if in := w.longestNoneIntervals[ip]; in.Duration() > r.Limits.Answer/2 {
				fmt.Fprintf(&b, "    longest no-answer %s%s %s-%s (%v)\n", ip, in.where(), in.From.Format("15:04:05.000"), in.To.Format("15:04:05.000"), in.Duration())
			}
		}
		moves += len(w.Moves)
		needless += w.NeedlessMoves
		statusMoves += len(w.StatusMoves)
		needlessStatus += w.NeedlessStatusMoves
		for _, d := range w.Dual {
			if d.Duration() > r.Limits.Overlap {
				dualLong++
			}
		}
		longestDual = max(longestDual, w.LongestDual)
		breaks += w.Breaks
		failed += w.FailedNew
		total += w.NewConns
		worstConv = max(worstConv, w.Convergence)
	}
	fmt.Fprintf(&b, "total: %d moves (%d needless), %d ServiceL2Status moves (%d needless), %d dual-answer intervals > %v (longest %v), %d broken keep-alive connections, %d/%d new connections failed, worst convergence %v\n",
		moves, needless, statusMoves, needlessStatus, dualLong, r.Limits.Overlap, longestDual, breaks, failed, total, worstConv.Round(time.Millisecond))
	if len(r.Violations) == 0 {
		b.WriteString("verdict: every target met\n")
	} else {
		fmt.Fprintf(&b, "verdict: %d violations\n  %s\n", len(r.Violations), strings.Join(r.Violations, "\n  "))
	}
	return b.String()
}
