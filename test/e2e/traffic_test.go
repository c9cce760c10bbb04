//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/ironlb/ironlb/api/v1beta1"
	"github.com/ironlb/ironlb/test/e2e/probe"
)

// clientLoop is e2e-probe running on a client host until finish.
type clientLoop struct {
	e        *Env
	host     string
	stopFile string
	wg       sync.WaitGroup
	res      Result
	err      error
	once     sync.Once
	endErr   error
}

// runProbe starts e2e-probe on the client with args, stopped by finish.
func (e *Env) runProbe(args ...string) *clientLoop { return e.runProbeOn(ClientHost, args...) }

// runProbeOn starts e2e-probe on host with args, stopped by finish.
func (e *Env) runProbeOn(host string, args ...string) *clientLoop {
	l := &clientLoop{e: e, host: host, stopFile: newStopFile()}
	l.wg.Add(1)
	go func() {
		defer l.wg.Done()
		l.res, l.err = e.Hosts.Run(context.Background(), host, append(append([]string{e.Probe}, args...), "--stop-file", l.stopFile)...)
	}()
	return l
}

func newStopFile() string { return fmt.Sprintf("/tmp/ironlb-e2e-stop-%d", time.Now().UnixNano()) }

// finish tells the client loop to stop and waits for its output in l.res.
func (l *clientLoop) finish(t testing.TB) {
	t.Helper()
	if err := l.end(); err != nil {
		t.Fatal(err)
	}
}

// end stops the loop (once; later calls wait for the first) and returns the
// error of stopping or running it.
func (l *clientLoop) end() error {
	l.once.Do(func() {
		if _, err := l.e.Hosts.Run(context.Background(), l.host, "touch", l.stopFile); err != nil {
			l.endErr = fmt.Errorf("stopping the client loop: %w", err)
			return
		}
		l.wg.Wait()
		if l.err != nil {
			l.endErr = fmt.Errorf("client loop: %w", l.err)
		}
	})
	return l.endErr
}

// keepAliveConns is how many persistent connections the hitless tests hold.
const keepAliveConns = 4

// traffic is e2e-probe running on the client against one IP: keepAliveConns
// persistent connections (one request each per 100 ms) and a new connection
// every 20 ms (50 req/s).
type traffic struct {
	loop      *clientLoop
	readyFile string
}

// startTraffic starts the traffic and waits until every persistent
// connection has been answered once.
func (e *Env) startTraffic(t testing.TB, ip string) *traffic {
	t.Helper()
	return e.startTrafficEvery(t, ip, 20*time.Millisecond)
}

// startTrafficEvery is startTraffic with a new connection every interval
// (several IPs at once: the client has two cores too).
func (e *Env) startTrafficEvery(t testing.TB, ip string, interval time.Duration) *traffic {
	t.Helper()
	if e.Probe == "" {
		t.Skip("no e2e-probe on the client (E2E_PROBE)")
	}
	tr := &traffic{readyFile: newStopFile() + "-ready"}
	tr.loop = e.runProbe("--url", serviceURL(ip), "--interval", interval.String(), "--timeout", "1s",
		"--keepalive", fmt.Sprint(keepAliveConns), "--keepalive-interval", "100ms", "--ready-file", tr.readyFile)
	// A test that fails before stop leaves no probe running on the client.
	t.Cleanup(func() { _ = tr.loop.end() }) // after stop: a no-op; before: the test has failed already
	poll(t, 30*time.Second, fmt.Sprintf("%d keep-alive connections from %s to %s answered", keepAliveConns, ClientHost, ip), func() (bool, string) {
		r, err := e.Hosts.Run(context.Background(), ClientHost, "rm", tr.readyFile)
		if err != nil {
			return false, err.Error()
		}
		return r.Code == 0, "not yet"
	})
	return tr
}

// stop ends the traffic and returns e2e-probe's summary; it is logged.
func (tr *traffic) stop(t testing.TB) probe.Report {
	t.Helper()
	tr.loop.finish(t)
	rep, err := probe.ParseReport(tr.loop.res.Stdout)
	if err != nil {
		t.Fatalf("%v\nstderr: %s", err, tr.loop.res.Stderr)
	}
	t.Logf("client traffic: %s", rep)
	return rep
}

// moves watches one Service's announcers while an action runs: the nodes of
// its ServiceL2Status objects as they are created, and the nodeAssigned
// events on it. A move is a new announcer that is not the last one.
type moves struct {
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu       sync.Mutex
	status   []string // node of each ServiceL2Status created, in order
	created  int      // ServiceL2Status objects created while the watch ran
	assigned []string // node of each nodeAssigned event, in order
	log      []string // everything seen, for the failure message
	// down holds, per watched stream, why its watch is not running now (the
	// API server away); a stream still down when the watch stops fails it.
	down map[string]error
}

// moveCount is the result of a moves watch.
type moveCount struct {
	// StatusMoves and EventMoves count changes of announcer seen in
	// ServiceL2Status objects and in nodeAssigned events, starting from the
	// announcer when the watch started.
	StatusMoves, EventMoves int
	// Created counts the ServiceL2Status objects created while the watch
	// ran (a move, a speaker restart: one each; more is churn).
	Created int
	// Last is the last announcer named by a ServiceL2Status.
	Last string
	// Log is the timeline.
	Log []string
}

func (m moveCount) String() string {
	return fmt.Sprintf("%d ServiceL2Status moves, %d nodeAssigned moves, %d ServiceL2Status created; timeline:\n  %s", m.StatusMoves, m.EventMoves, m.Created, strings.Join(m.Log, "\n  "))
}

// watchMoves starts watching the Service's announcers; owner is its
// announcer now.
func (e *Env) watchMoves(t testing.TB, ns, name, owner string) *moves {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	m := &moves{cancel: cancel, status: []string{owner}, assigned: []string{owner}, down: map[string]error{}}
	m.logf("watch starts: announcer %s", owner)

	labels := client.MatchingLabels{v1beta1.ServiceL2StatusServiceNameLabel: name, v1beta1.ServiceL2StatusServiceNamespaceLabel: ns}
	var l2 v1beta1.ServiceL2StatusList
	if err := e.C.List(ctx, &l2, client.InNamespace(Namespace), labels); err != nil {
		cancel()
		t.Fatal(err)
	}
	sel := fields(map[string]string{"involvedObject.kind": "Service", "involvedObject.name": name, "reason": "nodeAssigned"})
	evs, err := e.CS.CoreV1().Events(ns).List(ctx, metav1.ListOptions{FieldSelector: sel})
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	seen := map[string]int32{} // event name -> occurrences counted
	for _, ev := range evs.Items {
		seen[ev.Name] = occurrences(&ev)
	}

	m.wg.Add(2)
	go func() {
		defer m.wg.Done()
		m.follow(ctx, "ServiceL2Status", l2.ResourceVersion, func(rv string) (watch.Interface, error) {
			return e.C.Watch(ctx, &v1beta1.ServiceL2StatusList{}, client.InNamespace(Namespace), labels,
				&client.ListOptions{Raw: &metav1.ListOptions{ResourceVersion: rv}})
		}, func() (string, []runtime.Object, error) {
			var l v1beta1.ServiceL2StatusList
			return listed(&l, e.C.List(ctx, &l, client.InNamespace(Namespace), labels))
		}, func(ev watch.Event) {
			st, ok := ev.Object.(*v1beta1.ServiceL2Status)
			if !ok {
				return
			}
			m.mu.Lock()
			defer m.mu.Unlock()
			m.logfLocked("ServiceL2Status %s %s node=%s", st.Name, ev.Type, st.Status.Node)
			if ev.Type == watch.Added {
				m.created++
			}
			// A status being deleted claims nothing.
			if (ev.Type == watch.Added || ev.Type == watch.Modified) && st.DeletionTimestamp == nil {
				node := st.Status.Node
				if node == "" {
					node = st.Labels[v1beta1.ServiceL2StatusNodeLabel]
				}
				if node != "" && node != m.status[len(m.status)-1] {
					m.status = append(m.status, node)
				}
			}
		})
	}()
	go func() {
		defer m.wg.Done()
		m.follow(ctx, "nodeAssigned events", evs.ResourceVersion, func(rv string) (watch.Interface, error) {
			return e.CS.CoreV1().Events(ns).Watch(ctx, metav1.ListOptions{FieldSelector: sel, ResourceVersion: rv})
		}, func() (string, []runtime.Object, error) {
			return listed(e.CS.CoreV1().Events(ns).List(ctx, metav1.ListOptions{FieldSelector: sel}))
		}, func(w watch.Event) {
			ev, ok := w.Object.(*corev1.Event)
			if !ok || w.Type == watch.Deleted {
				return
			}
			m.mu.Lock()
			defer m.mu.Unlock()
			n := occurrences(ev)
			node := assignedNode(ev.Message)
			m.logfLocked("event %s %s x%d: %s", ev.Name, w.Type, n, ev.Message)
			for ; seen[ev.Name] < n; seen[ev.Name]++ {
				// A repeat of one speaker's event (a series) means the IP
				// came back to that node after leaving it.
				if node != m.assigned[len(m.assigned)-1] || seen[ev.Name] > 0 {
					m.assigned = append(m.assigned, node)
				}
			}
		})
	}()
	t.Cleanup(m.cancel)
	return m
}

// followWatch runs a watch from rv until ctx ends, handing each event to
// handle. When the server ends the watch, it resumes from the last resource
// version seen; while the API server is away (the fault tests stop it) it
// retries every second; when the server no longer has that version (410
// Gone, after an API server or etcd restart) it relists and hands every
// object listed to handle as Modified. It reports whether the watch runs
// (nil) or why not to setDown.
func followWatch(ctx context.Context, rv string, start func(rv string) (watch.Interface, error),
	relist func() (string, []runtime.Object, error), handle func(watch.Event), setDown func(error)) {
	retry := func(err error) {
		setDown(err)
		select {
		case <-ctx.Done():
		case <-time.After(time.Second):
		}
	}
	for ctx.Err() == nil {
		if rv == "" {
			var objs []runtime.Object
			var err error
			if rv, objs, err = relist(); err != nil {
				retry(fmt.Errorf("relisting: %w", err))
				continue
			}
			for _, o := range objs {
				handle(watch.Event{Type: watch.Modified, Object: o})
			}
		}
		w, err := start(rv)
		if err != nil {
			retry(err)
			continue
		}
		setDown(nil)
		for ev := range w.ResultChan() {
			if ev.Type == watch.Error {
				err := apierrors.FromObject(ev.Object)
				if apierrors.IsResourceExpired(err) || apierrors.IsGone(err) {
					rv = ""
				}
				setDown(err)
				break
			}
			if o, ok := ev.Object.(client.Object); ok {
				rv = o.GetResourceVersion()
			}
			handle(ev)
		}
		w.Stop()
	}
}

// listed returns a list's resource version and items, for followWatch's
// relist (err is the List call's).
func listed(list runtime.Object, err error) (string, []runtime.Object, error) {
	if err != nil {
		return "", nil, err
	}
	items, err := meta.ExtractList(list)
	if err != nil {
		return "", nil, err
	}
	acc, err := meta.ListAccessor(list)
	if err != nil {
		return "", nil, err
	}
	return acc.GetResourceVersion(), items, nil
}

// follow runs followWatch for one stream of the watch; outages go into the
// timeline, and stop fails the test if the stream is not running then.
func (m *moves) follow(ctx context.Context, stream, rv string, start func(rv string) (watch.Interface, error),
	relist func() (string, []runtime.Object, error), handle func(watch.Event)) {
	followWatch(ctx, rv, start, relist, handle, func(err error) { m.setDown(ctx, stream, err) })
}

// setDown records whether stream's watch runs (err nil) or why not, noting
// each change in the timeline; nothing is recorded once ctx has ended (the
// watch was stopped).
func (m *moves) setDown(ctx context.Context, stream string, err error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if ctx.Err() != nil {
		return
	}
	was := m.down[stream]
	switch {
	case err != nil && was == nil:
		m.logfLocked("watch of %s interrupted: %v", stream, err)
	case err == nil && was != nil:
		m.logfLocked("watch of %s running again", stream)
	}
	m.down[stream] = err
}

func (m *moves) logf(format string, args ...any) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.logfLocked(format, args...)
}

func (m *moves) logfLocked(format string, args ...any) {
	m.log = append(m.log, time.Now().Format("15:04:05.000 ")+fmt.Sprintf(format, args...))
}

// current returns the counts so far.
func (m *moves) current() moveCount {
	m.mu.Lock()
	defer m.mu.Unlock()
	return moveCount{StatusMoves: len(m.status) - 1, EventMoves: len(m.assigned) - 1, Created: m.created, Last: m.status[len(m.status)-1], Log: append([]string(nil), m.log...)}
}

// stop ends the watch and returns the counts; it is logged.
func (m *moves) stop(t testing.TB) moveCount {
	t.Helper()
	m.cancel()
	m.wg.Wait()
	c := m.current()
	t.Logf("announcer changes: %s", c)
	for stream, err := range m.down {
		if err != nil {
			t.Fatalf("the watch of %s was not running when it stopped: %v", stream, err)
		}
	}
	return c
}

// occurrences is how many times an event happened (a series counts each).
func occurrences(ev *corev1.Event) int32 {
	n := max(ev.Count, 1)
	if ev.Series != nil {
		n = max(n, ev.Series.Count)
	}
	return n
}

var assignedRE = regexp.MustCompile(`announcing from node "([^"]+)"`)

// assignedNode is the node named by a nodeAssigned event's message.
func assignedNode(msg string) string {
	if m := assignedRE.FindStringSubmatch(msg); m != nil {
		return m[1]
	}
	return msg
}

func fields(m map[string]string) string {
	var parts []string
	for k, v := range m {
		parts = append(parts, k+"="+v)
	}
	return strings.Join(parts, ",")
}
