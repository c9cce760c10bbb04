package speaker

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/ironlb/ironlb/internal/ownership"
)

// A node's kernel answering ARP/NDP says it is alive, not that it delivers:
// kube-proxy may have crashed or its rules been flushed, or a restored
// node's kube-proxy may not have synced yet. Like a cloud load balancer, a
// watcher therefore also asks the watched node's kube-proxy health endpoint
// (or a replacement serving the same one), and the node's vote combines both
// (voteOf). The verdict is evidence like the kernel's: sent as the watcher's
// vote, counted only from the node's watchers, acted on only by a majority
// of them and only by speakers that may act (package ownership).

// Timings of the delivery check.
const (
	// checkEvery: one health request per watched node this often.
	checkEvery = 200 * time.Millisecond
	// checkTimeout bounds one request. A request that times out is no
	// answer, not a failure: packet loss or a dead node (which the kernel
	// probes judge) must not read as an unhealthy kube-proxy.
	checkTimeout = time.Second
	// failAfter definite failures in a row (a 503, or the port refused by
	// the node's kernel) make a node failing; after a failure the next
	// check follows in recheckAfter, so a node is failing ~50-250 ms after
	// its kube-proxy stopped.
	failAfter    = 2
	recheckAfter = 50 * time.Millisecond
)

// DefaultHealthyAfter is how long a node's health endpoint must pass without
// a failure before it counts as healthy again (or for the first time, after
// its speaker joined): kube-proxy's endpoint answers 200 as soon as it
// starts, before its first sync of the rules, so a node that just came back
// takes no IP until then, and a flapping check does not flap IPs.
const DefaultHealthyAfter = 5 * time.Second

// DefaultKubeProxyHealthPort is kube-proxy's --healthz-bind-address port.
const DefaultKubeProxyHealthPort = 10256

// delivery is a watcher's finding on whether a node delivers, beyond its
// kernel answering.
type delivery int

const (
	// deliveryPending: passing, but not yet for healthyAfter, or not yet
	// asked (the zero value).
	deliveryPending delivery = iota
	// deliveryHealthy: passing for healthyAfter.
	deliveryHealthy
	// deliveryFailing: failAfter definite failures in a row.
	deliveryFailing
	// deliveryUnchecked: health checks are off (no port), the node has no
	// address to ask, or the endpoint has answered on no node yet.
	deliveryUnchecked
)

func (d delivery) String() string {
	return [...]string{"pending", "healthy", "failing", "unchecked"}[d]
}

// voteOf combines a watcher's two findings on a node into its vote: the
// kernel probe's (up, down, or unknown where no interface is on-link) and
// the delivery check's.
//
//   - A silent kernel is down whatever the health endpoint said.
//   - A failing endpoint is unhealthy: the kernel refused the port or
//     kube-proxy said 503, so the node is alive but does not deliver.
//   - Up needs the kernel to answer (or, where it cannot be asked, the
//     endpoint to pass) and, when checked, the endpoint to have passed for
//     healthyAfter; until then the watcher does not vouch for it (unknown):
//     with ownership.Options.RequireUp such a node takes no IP yet, while
//     the keys it owns stay as long as no majority finds it failing.
func voteOf(kernel ownership.Path, d delivery) ownership.Path {
	switch {
	case kernel == ownership.PathDown:
		return ownership.PathDown
	case d == deliveryFailing:
		return ownership.PathUnhealthy
	case d == deliveryHealthy:
		return ownership.PathUp
	case d == deliveryUnchecked:
		return kernel
	}
	return ownership.PathUnknown
}

// checkResult is one health request's outcome.
type checkResult int

const (
	// checkPassed: 200.
	checkPassed checkResult = iota
	// checkFailed: a definite failure, said by the node itself: any other
	// status, or the port refused (its kernel answered with a reset).
	checkFailed
	// checkNoAnswer: timeout, unreachable, or any other error: says nothing
	// about kube-proxy.
	checkNoAnswer
)

// deliveryState is the hysteresis of one node's delivery check: failing
// after failAfter definite failures in a row, healthy after passing for
// healthyAfter; no answer changes nothing. The zero value is pending.
type deliveryState struct {
	state        delivery
	fails        int
	passingSince time.Time // of the current run of passes; zero: none
	// since is when state was entered (status: "unhealthy since").
	since time.Time
}

// observe folds one check result in at now and reports whether the state
// changed.
func (s *deliveryState) observe(r checkResult, now time.Time, healthyAfter time.Duration) bool {
	prev := s.state
	switch r {
	case checkFailed:
		s.passingSince = time.Time{}
		s.fails++
		if s.fails >= failAfter {
			s.state = deliveryFailing
		}
	case checkPassed:
		s.fails = 0
		if s.passingSince.IsZero() {
			s.passingSince = now
		}
		switch {
		case now.Sub(s.passingSince) >= healthyAfter:
			s.state = deliveryHealthy
		case s.state == deliveryFailing:
			s.state = deliveryPending
		}
	}
	if s.state != prev {
		s.since = now
		return true
	}
	return false
}

// healthChecker asks nodes' kube-proxy health endpoints. The zero port turns
// the checks off.
type healthChecker struct {
	port         int
	healthyAfter time.Duration
	client       *http.Client
	// answered: the endpoint has answered HTTP (any status) on some node.
	// Until it has, the checks count for nothing (deliveryUnchecked): in a
	// cluster whose kube-proxy replacement serves no such endpoint every
	// node refuses the port, and reading that as every node failing would
	// take every IP off the segment. Once one node answered, a refused port
	// elsewhere is that node's kube-proxy missing.
	answered atomic.Bool
}

func newHealthChecker(port int, healthyAfter time.Duration) *healthChecker {
	if healthyAfter <= 0 {
		healthyAfter = DefaultHealthyAfter
	}
	return &healthChecker{port: port, healthyAfter: healthyAfter, client: &http.Client{
		Timeout: checkTimeout,
		// A fresh connection per request: a kept-alive one would outlive
		// the kube-proxy that accepted it and hide its restart.
		Transport: &http.Transport{DisableKeepAlives: true, Proxy: nil},
		// kube-proxy does not redirect; a redirect is not a pass.
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}}
}

// enabled reports whether nodes are health-checked at all.
func (c *healthChecker) enabled() bool { return c != nil && c.port > 0 }

// check asks addr's health endpoint once, and says why.
func (c *healthChecker) check(ctx context.Context, addr netip.Addr) (checkResult, string) {
	url := "http://" + net.JoinHostPort(addr.String(), strconv.Itoa(c.port)) + "/healthz"
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return checkNoAnswer, err.Error()
	}
	resp, err := c.client.Do(req)
	switch {
	case errors.Is(err, syscall.ECONNREFUSED):
		return checkFailed, "kube-proxy health port " + strconv.Itoa(c.port) + " refused on " + addr.String()
	case err != nil:
		return checkNoAnswer, err.Error()
	}
	resp.Body.Close()
	c.answered.Store(true)
	if resp.StatusCode != http.StatusOK {
		return checkFailed, fmt.Sprintf("kube-proxy health on %s: %s", addr, resp.Status)
	}
	return checkPassed, "kube-proxy healthy on " + addr.String()
}

// deliveryWatch runs one node's delivery checks for its probe loop: the
// loop reads the current finding (get) and is kicked when it changes.
type deliveryWatch struct {
	mu     sync.Mutex
	st     deliveryState
	reason string
	kick   chan struct{}
}

func newDeliveryWatch() *deliveryWatch { return &deliveryWatch{kick: make(chan struct{}, 1)} }

// get returns the current finding, since when it holds, and why;
// unchecked while c's endpoint has answered on no node yet.
func (w *deliveryWatch) get(c *healthChecker) (delivery, time.Time, string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !c.answered.Load() {
		return deliveryUnchecked, time.Time{}, "kube-proxy's health endpoint has answered on no node yet: not checked"
	}
	return w.st.state, w.st.since, w.reason
}

// run checks addr every checkEvery until ctx ends.
func (w *deliveryWatch) run(ctx context.Context, c *healthChecker, addr netip.Addr) {
	for {
		began := time.Now()
		r, why := c.check(ctx, addr)
		if ctx.Err() != nil {
			return
		}
		w.mu.Lock()
		changed := w.st.observe(r, time.Now(), c.healthyAfter)
		if r != checkNoAnswer || changed {
			w.reason = why
		}
		confirming := w.st.fails > 0 && w.st.state != deliveryFailing
		w.mu.Unlock()
		if changed {
			select {
			case w.kick <- struct{}{}:
			default:
			}
		}
		pause := checkEvery - time.Since(began)
		if confirming {
			pause = recheckAfter // one failure: confirm it at once
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(pause):
		}
	}
}
