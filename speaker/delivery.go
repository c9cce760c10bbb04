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

	"github.com/ironlb/ironlb/internal/layer2"
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

// awaitJudgement is how long an IP that never had an owner waits for a node
// that just joined to be judged (ownership.Options.AwaitJudgement): its
// healthy-after of passing checks, plus 5 s for the watchers' votes to
// arrive; a node still unjudged then is not waited for.
func awaitJudgement(healthyAfter time.Duration) time.Duration {
	if healthyAfter <= 0 {
		healthyAfter = DefaultHealthyAfter
	}
	return healthyAfter + 5*time.Second
}

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
	// checkFailedSure: two independent findings agree, the endpoint failed
	// and a Service's traffic through the node went nowhere (while another
	// node delivered it): failing at once, without waiting for failAfter.
	checkFailedSure
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
	case checkFailed, checkFailedSure:
		s.passingSince = time.Time{}
		s.fails++
		if r == checkFailedSure {
			s.fails = max(s.fails, failAfter)
		}
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
	_ = resp.Body.Close()
	c.answered.Store(true)
	if resp.StatusCode != http.StatusOK {
		return checkFailed, fmt.Sprintf("kube-proxy health on %s: %s", addr, resp.Status)
	}
	return checkPassed, "kube-proxy healthy on " + addr.String()
}

// Trying a Service through the node. kube-proxy's endpoint says what
// kube-proxy thinks of itself: a kube-proxy restarting (a rolling update)
// refuses its port while its rules still deliver every Service, and a node
// whose pod network is cut behind a healthy kube-proxy delivers nothing. So
// a watcher also tries a connection to one of the watched owner's Services
// through it: a TCP SYN to the Service's IP and first TCP port, in a frame
// addressed to the owner's MAC (layer2.SYNProber; reset at once, so no
// backend sees a connection). A SYN-ACK or a reset is delivered. No answer is
// the owner's fault only if the same try through another node (a control)
// is answered: else the Service itself is broken, and moving its IP would
// not help. The cost is bounded per node, not per Service: one SYN per
// watched owner every serviceEvery while it delivers, a sample of its
// Services over time.
const (
	// serviceEvery: a Service is tried through each watched owner this
	// often (with every health check), and at once when its kube-proxy
	// fails or a try failed.
	serviceEvery = checkEvery
	// firstTimeout: how long a try's first SYN waits (a LAN answers in well
	// under a millisecond): a slower answer costs only the confirmations.
	// synTimeout: how long each confirmation waits (a starved node answers
	// in tens of milliseconds).
	firstTimeout = 50 * time.Millisecond
	synTimeout   = 150 * time.Millisecond
	// confirmTries: a try whose SYN is not answered sends this many more at
	// once (other source ports), so one round ends within two timeouts and
	// fails only if all of them are lost: on a link losing 30 % each way
	// (51 % of SYN/SYN-ACK pairs) a round fails 0.2 % of the time.
	confirmTries = 8
	// serviceFailAfter rounds in a row through the owner unanswered while
	// the control answers make a failure (a lossy link: 0.2 % squared).
	serviceFailAfter = 2
)

// synProber is what the delivery check needs from layer2.SYNProber.
type synProber interface {
	Probe(ctx context.Context, pr layer2.SYNProbe) layer2.SYNProbeResult
}

// serviceCheck tries a watched owner's Services through it.
type serviceCheck struct {
	syn synProber
	// target returns an IP and TCP port of a Service node owns (none: the
	// node owns none, and only kube-proxy's endpoint judges it).
	target func(node string) (netip.AddrPort, bool)
	// control returns the MAC, on iface, of another node that is up.
	control func(node, iface string) (net.HardwareAddr, bool)
}

// serviceVerdict is one round's outcome.
type serviceVerdict int

const (
	// serviceUntried: no round (not due, no Service, no MAC yet).
	serviceUntried serviceVerdict = iota
	// serviceDelivered: the owner answered (SYN-ACK or reset).
	serviceDelivered
	// serviceBlackholed: the owner did not answer, the control did.
	serviceBlackholed
	// serviceUnknown: neither answered (the Service is broken, or this
	// watcher's own path is), or no control to compare with.
	serviceUnknown
)

// try sends a SYN for target to mac on iface and, when it is not answered
// within firstTimeout, confirmTries more at once; it reports whether one was
// answered. A try ends within firstTimeout + synTimeout.
func (sc *serviceCheck) try(ctx context.Context, iface string, mac net.HardwareAddr, target netip.AddrPort) (bool, string) {
	pr := layer2.SYNProbe{Interface: iface, OwnerMAC: mac, VIP: target, Timeout: firstTimeout}
	res := sc.syn.Probe(ctx, pr)
	pr.Timeout = synTimeout
	switch {
	case delivered(res.Outcome):
		return true, res.Why()
	case res.Outcome != layer2.SYNTimeout:
		return false, res.Why() // no interface, an error, canceled: more tries cannot help
	}
	results := make(chan layer2.SYNProbeResult, confirmTries) // buffered: no sender outlives the call
	for range confirmTries {
		go func() { results <- sc.syn.Probe(ctx, pr) }()
	}
	answered, why := false, res.Why()
	for range confirmTries {
		if r := <-results; delivered(r.Outcome) {
			answered, why = true, r.Why()
		}
	}
	return answered, why
}

// delivered: the SYN reached the Service through the node, whose backend
// answered it (a SYN-ACK, or a reset: nothing listens, but the path works).
func delivered(o layer2.SYNOutcome) bool {
	return o == layer2.SYNAnswered || o == layer2.SYNRefused
}

// round tries one of node's Services through it (its MAC on iface).
func (sc *serviceCheck) round(ctx context.Context, node, iface string, mac net.HardwareAddr) (serviceVerdict, string) {
	target, ok := sc.target(node)
	if !ok || iface == "" || len(mac) != 6 {
		return serviceUntried, ""
	}
	if ok, why := sc.try(ctx, iface, mac, target); ok {
		return serviceDelivered, "a connection to " + target.String() + " through it was answered (" + why + ")"
	}
	cmac, ok := sc.control(node, iface)
	if !ok {
		return serviceUnknown, "a connection to " + target.String() + " through it was not answered, and no other node to compare with"
	}
	if ok, _ := sc.try(ctx, iface, cmac, target); !ok {
		return serviceUnknown, "a connection to " + target.String() + " was answered neither through it nor through another node"
	}
	return serviceBlackholed, "a connection to " + target.String() + " through it was not answered, through another node it was"
}

// combineChecks folds a round's verdict into the health endpoint's result,
// given the rounds through the owner that failed in a row before (fails);
// it returns the result to observe and the new count.
//
//   - Delivered overrides a failing endpoint: kube-proxy restarting with its
//     rules in place still delivers.
//   - Blackholed with a failing endpoint fails at once (checkFailedSure);
//     with a passing one, once serviceFailAfter rounds in a row were
//     blackholed; before that the result says nothing (no pass either).
//   - Untried and unknown leave the endpoint's result as it is.
func combineChecks(r checkResult, v serviceVerdict, fails int) (checkResult, int) {
	switch v {
	case serviceDelivered:
		return checkPassed, 0
	case serviceBlackholed:
		fails++
		switch {
		case r == checkFailed:
			return checkFailedSure, fails
		case fails >= serviceFailAfter:
			return checkFailed, fails
		}
		return checkNoAnswer, fails
	}
	return r, fails
}

// deliveryWatch runs one node's delivery checks for its probe loop: the
// loop reads the current finding (get), tells where the node's kernel
// answers (setPath), and is kicked when the finding changes.
type deliveryWatch struct {
	node string
	svc  *serviceCheck // nil: kube-proxy's endpoint alone
	kick chan struct{}

	mu     sync.Mutex
	st     deliveryState
	reason string
	iface  string
	mac    net.HardwareAddr
}

func newDeliveryWatch(node string, svc *serviceCheck) *deliveryWatch {
	return &deliveryWatch{node: node, svc: svc, kick: make(chan struct{}, 1)}
}

// setPath records the interface and MAC the node's kernel last answered
// with, where its Services are tried.
func (w *deliveryWatch) setPath(iface string, mac net.HardwareAddr) {
	if iface == "" || len(mac) != 6 {
		return
	}
	w.mu.Lock()
	w.iface, w.mac = iface, mac
	w.mu.Unlock()
}

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

// run checks addr every checkEvery, and tries a Service every serviceEvery,
// until ctx ends.
func (w *deliveryWatch) run(ctx context.Context, c *healthChecker, addr netip.Addr) {
	var lastRound time.Time
	svcFails := 0
	for {
		began := time.Now()
		r, why := c.check(ctx, addr)
		if w.svc != nil && (r == checkFailed || svcFails > 0 || began.Sub(lastRound) >= serviceEvery) {
			w.mu.Lock()
			iface, mac := w.iface, w.mac
			w.mu.Unlock()
			v, vwhy := w.svc.round(ctx, w.node, iface, mac)
			if v != serviceUntried {
				lastRound = began
			}
			var r2 checkResult
			if r2, svcFails = combineChecks(r, v, svcFails); r2 != r || v == serviceBlackholed {
				why = vwhy
				if r == checkFailed && v == serviceDelivered {
					why = "kube-proxy's health endpoint fails, but " + vwhy
				}
			}
			r = r2
		}
		if ctx.Err() != nil {
			return
		}
		w.mu.Lock()
		changed := w.st.observe(r, time.Now(), c.healthyAfter)
		if r != checkNoAnswer || changed {
			w.reason = why
		}
		confirming := (w.st.fails > 0 || svcFails > 0) && w.st.state != deliveryFailing
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
