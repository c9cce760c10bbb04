package layer2

import (
	"context"
	"net/netip"
	"time"
)

type recheck struct {
	k  burstKey
	at time.Time
}

type burstKey struct {
	ip    netip.Addr
	iface string
}

// burst is the pending gratuitous announcements of one IP on one interface.
type burst struct {
	left  int // bursts still to send
	next  time.Time
	probe bool // send an RFC 5227 probe with the next burst
}

// scheduleLocked queues the takeover announcements of one IP on one
// interface, the first due at once.
//
// The RFC 5227 probe goes out with the first burst, after every IP's
// announcements (sendRanked), instead of delaying the claim by a probe wait
// (RFC 5227 waits 1-2 s plus 3 probes): on a failover
// the previous owner is usually dead and cannot answer, so waiting would only
// add its full length to every failover, the number ironlb is judged on. A
// live holder answers the probe (or announces itself) within a round trip,
// and the passive watch, which runs for as long as the IP is owned, reports
// that as a Conflict if it persists past ConflictGrace; the takeover is then
// bounded to one defensive announcement per ConflictInterval, never a loop.
func (a *Announcer) scheduleLocked(k burstKey, now time.Time, probe bool) {
	if a.opts.GratuitousCount < 0 {
		if a.opts.RefreshInterval > 0 {
			a.bursts[k] = &burst{left: 1, next: now.Add(a.opts.RefreshInterval)}
		}
		return
	}
	a.bursts[k] = &burst{left: a.opts.GratuitousCount, next: now, probe: probe}
}

func (a *Announcer) kickGARP() {
	select {
	case a.garpCh <- struct{}{}:
	default:
	}
}

// garpLoop sends the scheduled gratuitous announcements and the bounded
// defensive ones until ctx ends.
func (a *Announcer) garpLoop(ctx context.Context) {
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		next := a.sendDue()
		wait := time.Hour
		if !next.IsZero() {
			wait = max(time.Until(next), 0)
		}
		timer.Reset(wait)
		select {
		case <-ctx.Done():
			return
		case <-timer.C:
		case <-a.garpCh:
		case rc := <-a.recheckCh:
			a.mu.Lock()
			if _, pending := a.rechecks[rc.k]; !pending {
				a.rechecks[rc.k] = rc.at
			}
			a.mu.Unlock()
		case k := <-a.defendCh:
			a.mu.Lock()
			if r := a.responders[k.iface]; r != nil && r.owned.Load().owns(k.ip) && a.bursts[k] == nil {
				a.bursts[k] = &burst{left: 1, next: time.Now()}
			}
			a.mu.Unlock()
		}
	}
}

// sendDue sends every announcement that is due and returns when the next
// one is (zero: none pending). It sends under the lock, so once
// Apply returns nothing more is sent for the IPs it removed; a send
// is one non-blocking raw-socket write per frame.
func (a *Announcer) sendDue() time.Time {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.sendDueLocked(time.Now())
}

// sendDueLocked is sendDue with a.mu held.
func (a *Announcer) sendDueLocked(now time.Time) time.Time {
	if u := a.holdUntil.Load(); u != 0 && now.UnixNano() < u {
		return time.Unix(0, u) // Hold: nothing goes out before its end
	}
	var next time.Time
	for k, at := range a.rechecks {
		if at.After(now) {
			if next.IsZero() || at.Before(next) {
				next = at
			}
			continue
		}
		delete(a.rechecks, k)
		if r := a.responders[k.iface]; r != nil && r.owned.Load().owns(k.ip) {
			if err := r.sendProbe(k.ip); err != nil {
				a.log.Error(err, "sending conflict re-check probe failed", "interface", k.iface, "ip", k.ip.String())
			}
		}
	}
	var due []dueBurst
	for k, b := range a.bursts {
		if b.next.After(now) {
			if next.IsZero() || b.next.Before(next) {
				next = b.next
			}
			continue
		}
		r := a.responders[k.iface]
		if r == nil || !r.owned.Load().owns(k.ip) {
			delete(a.bursts, k)
			continue
		}
		frames, err := r.gratuitousFrames(k.ip, b.probe)
		if err != nil {
			a.log.Error(err, "building gratuitous announcement failed", "interface", k.iface, "ip", k.ip.String())
		}
		due = append(due, dueBurst{k: k, r: r, frames: frames})
		b.probe = false
		b.left--
		switch {
		case b.left > 0:
			b.next = now.Add(a.opts.GratuitousInterval)
		case a.opts.RefreshInterval > 0:
			b.left = 1
			b.next = now.Add(a.opts.RefreshInterval)
		default:
			delete(a.bursts, k)
			continue
		}
		if next.IsZero() || b.next.Before(next) {
			next = b.next
		}
	}
	a.sendRanked(due)
	return next
}

// dueBurst is the frames of one IP's burst being sent (sendRanked).
type dueBurst struct {
	k      burstKey
	r      *responder
	frames []announcement
	sent   int  // gratuitous frames written
	failed bool // a write failed: the rest of this burst is skipped
}

// sendRanked writes the due bursts one rank at a time: every IP's first
// frame before any IP's second, and the probes, which announce nothing,
// last. A takeover of ~800 IPs is ~2,400 frames; when the sender is
// preempted mid-burst on a loaded node, what is left waits, and ranked, what
// is left is other IPs' repeats and probes, not their only announcement.
func (a *Announcer) sendRanked(due []dueBurst) {
	for rank, more := 0, true; more; rank++ {
		more = false
		for i := range due {
			d := &due[i]
			if d.failed || rank >= len(d.frames) {
				continue
			}
			more = true
			f := d.frames[rank]
			if err := d.r.writeFrame(d.k.ip, f.b); err != nil {
				d.failed = true
				a.log.Error(err, "sending gratuitous announcement failed", "interface", d.k.iface, "ip", d.k.ip.String())
				continue
			}
			if !f.probe {
				d.sent++
			}
		}
	}
	for _, d := range due {
		if d.sent > 0 {
			a.metricsFor(d.k.ip).gratuitous.Add(float64(d.sent))
		}
	}
}
