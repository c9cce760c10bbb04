package speaker

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	eventsv1 "k8s.io/api/events/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	crmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/ironlb/ironlb/api/v1beta1"
	"github.com/ironlb/ironlb/internal/election"
	"github.com/ironlb/ironlb/internal/layer2"
	"github.com/ironlb/ironlb/internal/ownership"
	"github.com/ironlb/ironlb/internal/statusview"
	"github.com/ironlb/ironlb/test/procstat"
)

const testNS = "metallb-system"

// startEnv starts a real API server (envtest) with ironlb's CRDs, or skips.
func startEnv(t *testing.T) (*rest.Config, client.Client, *envtest.Environment) {
	t.Helper()
	assets := os.Getenv("KUBEBUILDER_ASSETS")
	if assets == "" {
		assets, _ = filepath.Abs(filepath.Join("..", "bin"))
	}
	for _, b := range []string{"kube-apiserver", "etcd"} {
		if _, err := os.Stat(filepath.Join(assets, b)); err != nil {
			t.Skipf("envtest binaries missing (%s not in %s; build them with `make tools`): %v", b, assets, err)
		}
	}
	env := &envtest.Environment{
		BinaryAssetsDirectory: assets,
		CRDDirectoryPaths:     []string{filepath.Join("..", "config", "crd", "bases")},
		ErrorIfCRDPathMissing: true,
	}
	cfg, err := env.Start()
	if err != nil {
		t.Fatalf("start envtest: %v", err)
	}
	t.Cleanup(func() {
		if err := env.Stop(); err != nil {
			t.Logf("stop envtest: %v", err)
		}
	})
	scheme, err := Scheme()
	if err != nil {
		t.Fatal(err)
	}
	c, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	return cfg, c, env
}

func create(t *testing.T, c client.Client, objs ...client.Object) {
	t.Helper()
	for _, o := range objs {
		if err := c.Create(context.Background(), o); err != nil {
			t.Fatalf("create %T %s: %v", o, o.GetName(), err)
		}
	}
}

// runSpeaker runs a speaker for node on memberlist address ip:port with no
// network interfaces (the announcer runs for real, with nothing to answer on:
// no root needed). stop stops it; readyz is the URL of its readiness
// endpoint.
func runSpeaker(t *testing.T, cfg *rest.Config, node, ip string, port int) (stop func(), readyz string) {
	t.Helper()
	return runSpeakerWith(t, cfg, node, ip, port, nil)
}

// runSpeakerWith is runSpeaker with options changed by mod (nil: none).
func runSpeakerWith(t *testing.T, cfg *rest.Config, node, ip string, port int, mod func(*Options)) (stop func(), readyz string) {
	t.Helper()
	healthAddr := net.JoinHostPort(ip, fmt.Sprint(freeUDPTCPPort(t, ip)))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	opts := Options{
		NodeName:               node,
		Namespace:              testNS,
		PodName:                "speaker-" + node,
		MLBindAddr:             ip,
		MLBindPort:             port,
		MLLabels:               "app=speaker",
		MLSecretKeyPath:        testKeyFile(t),
		MetricsBindAddress:     "0",
		HealthProbeBindAddress: healthAddr,
		RestConfig:             cfg,
		Logger:                 speakerLogger(t, node),
		Layer2: layer2.Options{
			Links:      func() ([]layer2.Link, error) { return nil, nil },
			Registerer: prometheus.NewRegistry(),
		},
	}
	opts.Membership.RejoinInterval = 500 * time.Millisecond
	if mod != nil {
		mod(&opts)
	}
	go func() { done <- Run(ctx, opts) }()
	return func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("speaker %s: %v", node, err)
			}
		case <-time.After(60 * time.Second):
			t.Errorf("speaker %s did not stop", node)
		}
	}, "http://" + healthAddr + "/readyz"
}

// speakerSet is a speaker for every seeded node; those still running stop
// when the test ends.
type speakerSet struct {
	stops  map[string]func()
	readyz map[string]string
}

func runSpeakers(t *testing.T, cfg *rest.Config, nodes map[string]string, port int) *speakerSet {
	t.Helper()
	s := &speakerSet{stops: map[string]func(){}, readyz: map[string]string{}}
	for n, ip := range nodes {
		s.stops[n], s.readyz[n] = runSpeaker(t, cfg, n, ip, port)
	}
	t.Cleanup(func() {
		for _, stop := range s.stops {
			stop()
		}
	})
	return s
}

// stop stops node's speaker now.
func (s *speakerSet) stop(node string) {
	s.stops[node]()
	delete(s.stops, node)
}

// waitReady waits until every running speaker reports ready.
func (s *speakerSet) waitReady(t *testing.T) {
	t.Helper()
	for n := range s.stops {
		eventually(t, n+" ready", 60*time.Second, readyz(s.readyz[n]))
	}
}

// readyz returns "" when the speaker's readiness endpoint answers 200, else
// what it answered.
func readyz(url string) func() string {
	return func() string {
		resp, err := http.Get(url)
		if err != nil {
			return err.Error()
		}
		defer func() { _ = resp.Body.Close() }() // read below; nothing to flush
		body, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusOK {
			return fmt.Sprintf("HTTP %d: %s", resp.StatusCode, body)
		}
		return ""
	}
}

// testKeyFile writes the memberlist key every test speaker shares, as the
// mounted Secret would provide it.
func testKeyFile(t *testing.T) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), SecretKeyField)
	if err := os.WriteFile(p, []byte("a long random string"), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func speakerLogger(t *testing.T, node string) logr.Logger {
	if !testing.Verbose() {
		return logr.Discard()
	}
	return funcr.New(func(prefix, args string) { t.Log(node, prefix, args) }, funcr.Options{})
}

// eventually polls cond until it returns "" or the deadline passes; then it
// fails with cond's last explanation.
func eventually(t testing.TB, what string, deadline time.Duration, cond func() string) {
	t.Helper()
	end := time.Now().Add(deadline)
	for {
		msg := cond()
		if msg == "" {
			return
		}
		if time.Now().After(end) {
			t.Fatalf("%s: not reached within %s: %s", what, deadline, msg)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func statuses(t *testing.T, c client.Client) []v1beta1.ServiceL2Status {
	var l v1beta1.ServiceL2StatusList
	if err := c.List(context.Background(), &l, client.InNamespace(testNS)); err != nil {
		t.Fatalf("list ServiceL2Status: %v", err)
	}
	return l.Items
}

func describeStatuses(items []v1beta1.ServiceL2Status) string {
	var b strings.Builder
	for _, s := range items {
		fmt.Fprintf(&b, "[%s node=%s label=%s svc=%s/%s owners=%d] ", s.Name, s.Status.Node,
			s.Labels[v1beta1.ServiceL2StatusNodeLabel], s.Status.ServiceNamespace, s.Status.ServiceName, len(s.OwnerReferences))
	}
	return fmt.Sprintf("%d objects %s", len(items), b.String())
}

// testVIP is the Service's IP in the seeded cluster.
const testVIP = "172.18.255.201"

// seed creates the install namespace, a pool and an
// advertisement, nodes w1 and w2 with their speaker Pods (IPs 127.0.0.1 and
// 127.0.0.2, the memberlist addresses), and Service ns1/web with testVIP and a
// ready endpoint on w1.
func seed(t *testing.T, c client.Client) (nodes map[string]string, svc *corev1.Service, eps *discoveryv1.EndpointSlice) {
	t.Helper()
	ctx := context.Background()
	create(t, c,
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: testNS}},
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "ns1"}},
		&v1beta1.IPAddressPool{ObjectMeta: metav1.ObjectMeta{Namespace: testNS, Name: "p1"},
			Spec: v1beta1.IPAddressPoolSpec{Addresses: []string{"172.18.255.200-172.18.255.250"}}},
		&v1beta1.L2Advertisement{ObjectMeta: metav1.ObjectMeta{Namespace: testNS, Name: "l2"},
			Spec: v1beta1.L2AdvertisementSpec{IPAddressPools: []string{"p1"}, Interfaces: []string{"eth0"}}},
	)
	nodes = map[string]string{"w1": "127.0.0.1", "w2": "127.0.0.2"}
	for _, n := range []string{"w1", "w2"} {
		create(t, c, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n}})
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: testNS, Name: "speaker-" + n, Labels: map[string]string{"app": "speaker"}},
			Spec:       corev1.PodSpec{NodeName: n, Containers: []corev1.Container{{Name: "speaker", Image: "ghcr.io/ironlb/ironlb"}}},
		}
		create(t, c, pod)
		pod.Status.PodIP = nodes[n]
		pod.Status.PodIPs = []corev1.PodIP{{IP: nodes[n]}}
		if err := c.Status().Update(ctx, pod); err != nil {
			t.Fatalf("pod status: %v", err)
		}
	}
	svc = &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns1", Name: "web"},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer,
			Ports: []corev1.ServicePort{{Port: 80, Protocol: corev1.ProtocolTCP}}},
	}
	create(t, c, svc)
	svc.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: testVIP}}
	if err := c.Status().Update(ctx, svc); err != nil {
		t.Fatalf("service status: %v", err)
	}
	ready := true
	w1 := "w1"
	eps = &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: "ns1", Name: "web-abc", Labels: map[string]string{discoveryv1.LabelServiceName: "web"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints: []discoveryv1.Endpoint{{Addresses: []string{"10.10.1.5"}, NodeName: &w1,
			Conditions: discoveryv1.EndpointConditions{Ready: &ready}}},
	}
	create(t, c, eps)

	return nodes, svc, eps
}

// TestSpeakersAgainstAPIServer runs two real speakers (memberlist on
// 127.0.0.1 and 127.0.0.2, announcers without interfaces) against a real API
// server and checks the ServiceL2Status objects and events they produce, the
// takeover when the owner stops, and the clean-up.
func TestSpeakersAgainstAPIServer(t *testing.T) {
	if testing.Short() {
		t.Skip("envtest: skipped in -short mode")
	}
	cfg, c, env := startEnv(t)
	ctx := context.Background()
	port := freeUDPTCPPort(t, "127.0.0.1", "127.0.0.2")

	nodes, svc, eps := seed(t, c)
	const vip = testVIP
	ready := true

	speakers := runSpeakers(t, cfg, nodes, port)

	winner := election.Rank(vip, []string{"w1", "w2"})[0]
	other := map[string]string{"w1": "w2", "w2": "w1"}[winner]
	t.Logf("expected owner of %s: %s", vip, winner)

	eventually(t, "one ServiceL2Status from the elected node "+winner, 60*time.Second, checkOwner(t, c, winner))
	speakers.waitReady(t)

	nodeAssigned := func(node string) func() string {
		return func() string {
			var evs eventsv1.EventList
			if err := c.List(ctx, &evs, client.InNamespace("ns1")); err != nil {
				return err.Error()
			}
			want := fmt.Sprintf("announcing from node %q with protocol %q", node, Protocol)
			var seen []string
			for _, e := range evs.Items {
				if e.Regarding.Name == "web" && e.Reason == EventNodeAssigned && e.Type == corev1.EventTypeNormal && e.Note == want {
					return ""
				}
				seen = append(seen, e.Reason+": "+e.Note)
			}
			return fmt.Sprintf("no %s event %q; events: %v", EventNodeAssigned, want, seen)
		}
	}
	eventually(t, "nodeAssigned event", 30*time.Second, nodeAssigned(winner))

	// Graceful stop of the owner: the other node takes over and replaces the
	// ServiceL2Status (the old owner's Pod still exists, so the new owner
	// deletes the stale object itself).
	speakers.stop(winner)
	eventually(t, "takeover by "+other, 60*time.Second, checkOwner(t, c, other))
	eventually(t, "nodeAssigned event for the new owner", 30*time.Second, nodeAssigned(other))

	// No ready endpoint: nobody announces, the status goes away.
	eps.Endpoints[0].Conditions.Ready = new(bool)
	if err := c.Update(ctx, eps); err != nil {
		t.Fatal(err)
	}
	eventually(t, "status removed without ready endpoints", 30*time.Second, func() string {
		if items := statuses(t, c); len(items) != 0 {
			return describeStatuses(items)
		}
		return ""
	})
	eps.Endpoints[0].Conditions.Ready = &ready
	if err := c.Update(ctx, eps); err != nil {
		t.Fatal(err)
	}
	eventually(t, "announced again with a ready endpoint", 30*time.Second, checkOwner(t, c, other))

	// Service deleted: the status goes away.
	if err := c.Delete(ctx, svc); err != nil {
		t.Fatal(err)
	}
	eventually(t, "status removed with the service", 30*time.Second, func() string {
		if items := statuses(t, c); len(items) != 0 {
			return describeStatuses(items)
		}
		return ""
	})

	// A speaker whose credentials may not list its inputs never syncs its
	// caches, so it could not take anything over: it must not report ready.
	nobody, err := env.AddUser(envtest.User{Name: "speaker-without-rbac"}, cfg)
	if err != nil {
		t.Fatal(err)
	}
	stopW3, w3Ready := runSpeaker(t, nobody.Config(), "w3", "127.0.0.3", freeUDPTCPPort(t, "127.0.0.3"))
	defer stopW3()
	eventually(t, "w3 serves /readyz", 30*time.Second, func() string {
		if msg := readyz(w3Ready)(); strings.Contains(msg, "connection refused") {
			return msg
		}
		return ""
	})
	if msg := readyz(w3Ready)(); !strings.Contains(msg, "HTTP 500") || !strings.Contains(msg, "can-announce") {
		t.Errorf("speaker w3 without RBAC: /readyz = %q, want HTTP 500 from the can-announce check", msg)
	}
	// Once allowed to read, it syncs and turns ready (and can stop cleanly:
	// see startManager for a manager that never synced).
	create(t, c, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "speaker-without-rbac"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "cluster-admin"},
		Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: "speaker-without-rbac"}},
	})
	eventually(t, "w3 ready once granted RBAC", 90*time.Second, readyz(w3Ready))
}

// TestFailoverWhileAPIServerDown: with the API server stopped, the speakers
// keep their cache, and a memberlist departure still moves the IP: the
// survivor's announcer takes it over on membership information alone.
func TestFailoverWhileAPIServerDown(t *testing.T) {
	if testing.Short() {
		t.Skip("envtest: skipped in -short mode")
	}
	cfg, c, env := startEnv(t)
	port := freeUDPTCPPort(t, "127.0.0.1", "127.0.0.2")
	nodes, _, _ := seed(t, c)

	speakers := runSpeakers(t, cfg, nodes, port)
	winner := election.Rank(testVIP, []string{"w1", "w2"})[0]
	other := map[string]string{"w1": "w2", "w2": "w1"}[winner]
	eventually(t, "one ServiceL2Status from "+winner, 60*time.Second, checkOwner(t, c, winner))
	eventually(t, winner+" announces", 10*time.Second, announcedBy(winner, true))
	eventually(t, other+" does not announce", 10*time.Second, announcedBy(other, false))

	// Both must have synced their caches before the API server goes away: a
	// speaker that never saw the Service cannot take it over (under load the
	// second speaker's start-up has lagged behind the first's announcement).
	speakers.waitReady(t)

	// SIGKILL, as a crashed control plane: a graceful stop drains the
	// speakers' watches for a minute.
	killAPIServer(t, env)
	if err := c.List(context.Background(), &v1beta1.ServiceL2StatusList{}); err == nil {
		t.Fatal("API server still answers after Stop")
	}
	// Still announcing with the API server gone.
	eventually(t, winner+" keeps announcing", 10*time.Second, announcedBy(winner, true))

	speakers.stop(winner)
	eventually(t, other+" takes over without the API server", 30*time.Second, announcedBy(other, true))
}

// killAPIServer SIGKILLs the envtest kube-apiserver: the child process of this
// test binary whose command line carries the environment's secure port.
func killAPIServer(t *testing.T, env *envtest.Environment) {
	t.Helper()
	port := env.ControlPlane.APIServer.Port // the secure serving address (SecureServing.ListenAddr)
	dirs, _ := filepath.Glob("/proc/[0-9]*")
	for _, d := range dirs {
		b, err := os.ReadFile(filepath.Join(d, "cmdline"))
		if err != nil {
			continue
		}
		args := strings.Split(string(b), "\x00")
		if !strings.HasSuffix(args[0], "kube-apiserver") || !slices.Contains(args, "--secure-port="+port) {
			continue
		}
		pid, _ := strconv.Atoi(filepath.Base(d))
		if parentPID(d) != os.Getpid() {
			continue // not ours: envtest starts it as our child
		}
		if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
			t.Fatalf("kill kube-apiserver pid %d: %v", pid, err)
		}
		t.Logf("killed kube-apiserver pid %d (port %s)", pid, port)
		return
	}
	t.Fatalf("kube-apiserver with --secure-port=%s not found", port)
}

// parentPID reads the parent pid from /proc/<pid>/stat.
func parentPID(procDir string) int {
	st, err := procstat.ReadFile(filepath.Join(procDir, "stat"))
	if err != nil {
		return -1
	}
	return st.PPID
}

// announcedBy checks the metallb_speaker_announced gauge of node for testVIP
// (the speakers of one test process share controller-runtime's registry; the
// node label tells them apart).
func announcedBy(node string, want bool) func() string {
	return func() string {
		mfs, err := crmetrics.Registry.Gather()
		if err != nil {
			return err.Error()
		}
		got := false
		for _, mf := range mfs {
			if mf.GetName() != "metallb_speaker_announced" {
				continue
			}
			for _, m := range mf.GetMetric() {
				l := map[string]string{}
				for _, lp := range m.GetLabel() {
					l[lp.GetName()] = lp.GetValue()
				}
				if l["node"] == node && l["ip"] == testVIP && l["service"] == "ns1/web" && l["protocol"] == Protocol && m.GetGauge().GetValue() == 1 {
					got = true
				}
			}
		}
		if got != want {
			return fmt.Sprintf("metallb_speaker_announced{node=%q,ip=%q} present=%v, want %v", node, testVIP, got, want)
		}
		return ""
	}
}

// bareOwners is an ownership layer that knows no Service and no peer, for
// status writer tests that hand it their Want directly.
func bareOwners(self string) *owners {
	return newOwners(logr.Discard(), self, ownership.Options{}, newFakeAnnouncer(), newMetrics(nil), nopRecorder{})
}

// TestStatusNotDuplicated calls syncStatus repeatedly: still exactly one
// object; the conflict condition is set and cleared; losing the election
// deletes the object.
func TestStatusNotDuplicated(t *testing.T) {
	if testing.Short() {
		t.Skip("envtest: skipped in -short mode")
	}
	cfg, c, _ := startEnv(t)
	ctx := context.Background()
	create(t, c, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: testNS}})
	// The speaker's client as Run builds it: reads from an informer cache
	// carrying setupIndexes, writes and direct reads to the API server.
	// Between calls the test waits for the cache to catch up, as the watch
	// event that starts the next reconcile would.
	svc := lbService("172.18.255.201")
	want := Want{Announce: true, AllInterfaces: true, IPs: []netip.Addr{netip.MustParseAddr("172.18.255.201")}}
	key := types.NamespacedName{Namespace: "ns1", Name: "web"}
	cached, direct := indexedClient(t, cfg)
	r := &statusWriter{Client: cached, apiRead: direct, log: logr.Discard(), opts: Options{NodeName: "w1", Namespace: testNS},
		conflicts: newConflicts(), created: map[string]string{}, own: bareOwners("w1")}
	sync := func(svc *corev1.Service, want Want) {
		t.Helper()
		if err := r.syncStatus(ctx, key, svc, want); err != nil {
			t.Fatal(err)
		}
		eventually(t, "the cache shows the ServiceL2Status objects", 30*time.Second, caughtUp(t, cached, direct))
	}
	for i := 0; i < 3; i++ {
		sync(svc, want)
	}
	items := statuses(t, c)
	if len(items) != 1 || items[0].Status.Node != "w1" || len(items[0].Status.Interfaces) != 0 ||
		items[0].Annotations[v1beta1.ServiceL2StatusIPsAnnotation] != "172.18.255.201" {
		t.Fatalf("want one status for w1 with no interfaces listed, annotated with its IP: %s", describeStatuses(items))
	}
	// Another slot of the Service moves here: the record names both IPs.
	two := want
	two.IPs = append(slices.Clone(want.IPs), netip.MustParseAddr("172.18.255.202"))
	sync(svc, two)
	if items = statuses(t, c); len(items) != 1 || items[0].Annotations[v1beta1.ServiceL2StatusIPsAnnotation] != "172.18.255.201,172.18.255.202" {
		t.Fatalf("want the record annotated with both IPs: %+v", items)
	}
	sync(svc, want)
	// A conflict report shows as a condition, and clears after conflictHold.
	mac, _ := net.ParseMAC("02:00:00:00:00:99")
	r.conflicts.set(key.String(), conflictRecord{last: time.Now(),
		Conflict: layer2.Conflict{IP: netip.MustParseAddr("172.18.255.201"), MAC: mac, Interface: "eth0"}})
	sync(svc, want)
	items = statuses(t, c)
	if len(items) != 1 || !meta.IsStatusConditionTrue(items[0].Status.Conditions, ConditionAddressConflict) ||
		!strings.Contains(meta.FindStatusCondition(items[0].Status.Conditions, ConditionAddressConflict).Message, "02:00:00:00:00:99") {
		t.Fatalf("want an AddressConflict=True condition naming the MAC: %+v", items)
	}
	r.conflicts.set(key.String(), conflictRecord{last: time.Now().Add(-2 * conflictHold)})
	sync(svc, want)
	items = statuses(t, c)
	if len(items) != 1 || meta.FindStatusCondition(items[0].Status.Conditions, ConditionAddressConflict) == nil ||
		meta.IsStatusConditionTrue(items[0].Status.Conditions, ConditionAddressConflict) {
		t.Fatalf("want the AddressConflict condition False after the hold time: %+v", items)
	}

	// A record deleted behind the speaker's back is re-created once; a
	// cache that still shows the deleted one must not make the speaker keep
	// it and delete the new one (each reconcile would then re-create a
	// record, as seen after an etcd restart).
	gone := statuses(t, c)[0]
	if err := direct.Delete(ctx, &gone); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the cache sees the deletion", 30*time.Second, caughtUp(t, cached, direct))
	sync(svc, want)
	items = statuses(t, c)
	if len(items) != 1 || items[0].Name == gone.Name {
		t.Fatalf("want one new record after %s was deleted: %s", gone.Name, describeStatuses(items))
	}
	fresh := items[0]
	// Created in the same second as fresh: make it older, as a record kept
	// across the speaker's life would be.
	gone.CreationTimestamp = metav1.NewTime(fresh.CreationTimestamp.Add(-time.Hour))
	r.Client = interceptor.NewClient(cached, interceptor.Funcs{
		List: func(ctx context.Context, cl client.WithWatch, list client.ObjectList, opts ...client.ListOption) error {
			if err := cl.List(ctx, list, opts...); err != nil {
				return err
			}
			if l, ok := list.(*v1beta1.ServiceL2StatusList); ok {
				l.Items = append(l.Items, gone) // what a lagging cache shows
			}
			return nil
		},
	})
	for i := 0; i < 3; i++ {
		if err := r.syncStatus(ctx, key, svc, want); err != nil {
			t.Fatalf("sync %d with a lagging cache: %v", i, err)
		}
	}
	if items = statuses(t, c); len(items) != 1 || items[0].Name != fresh.Name {
		t.Fatalf("with a lagging cache the speaker replaced %s: %s", fresh.Name, describeStatuses(items))
	}
	r.Client = cached

	// Losing the election deletes it.
	sync(svc, Want{})
	if items := statuses(t, c); len(items) != 0 {
		t.Fatalf("non-owner kept its status: %s", describeStatuses(items))
	}
	var probe v1beta1.ServiceL2Status
	err := c.Get(ctx, types.NamespacedName{Namespace: testNS, Name: "does-not-exist"}, &probe)
	if !apierrors.IsNotFound(err) {
		t.Fatalf("sanity: %v", err)
	}
}

// TestStatusServiceCacheLags: a speaker whose cache does not have a Service
// (lagging after an API server restart) must not delete another node's
// record of it unless the API server confirms the Service is gone.
func TestStatusServiceCacheLags(t *testing.T) {
	if testing.Short() {
		t.Skip("envtest: skipped in -short mode")
	}
	cfg, c, _ := startEnv(t)
	ctx := context.Background()
	create(t, c, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: testNS}},
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "ns1"}})
	svc := lbService("172.18.255.201")
	svc.Spec.Ports = []corev1.ServicePort{{Port: 80, Protocol: corev1.ProtocolTCP}}
	create(t, c, svc)
	key := client.ObjectKeyFromObject(svc)
	record := &v1beta1.ServiceL2Status{ObjectMeta: metav1.ObjectMeta{Namespace: testNS, Name: "l2-w2", Labels: map[string]string{
		v1beta1.ServiceL2StatusNodeLabel: "w2", v1beta1.ServiceL2StatusServiceNameLabel: key.Name,
		v1beta1.ServiceL2StatusServiceNamespaceLabel: key.Namespace}}}
	create(t, c, record)
	cached, direct := indexedClient(t, cfg)
	eventually(t, "the cache shows the record", 30*time.Second, caughtUp(t, cached, direct))
	w := &statusWriter{Client: cached, apiRead: direct, log: logr.Discard(), opts: Options{NodeName: "w1", Namespace: testNS},
		conflicts: newConflicts(), created: map[string]string{}, own: bareOwners("w1")}
	// What the lagging cache says: no such Service.
	if err := w.syncStatus(ctx, key, nil, Want{}); err != nil {
		t.Fatal(err)
	}
	if items := statuses(t, c); len(items) != 1 {
		t.Fatalf("w1 deleted w2's record of a Service that exists: %s", describeStatuses(items))
	}
	// Gone for real: any speaker cleans up.
	if err := c.Delete(ctx, svc); err != nil {
		t.Fatal(err)
	}
	if err := w.syncStatus(ctx, key, nil, Want{}); err != nil {
		t.Fatal(err)
	}
	if items := statuses(t, c); len(items) != 0 {
		t.Fatalf("the record of a deleted Service stayed: %s", describeStatuses(items))
	}
}

// indexedClient returns the speaker's client as Run builds it (reads from an
// informer cache carrying setupIndexes) and an uncached one.
func indexedClient(t *testing.T, cfg *rest.Config) (cached client.WithWatch, direct client.Client) {
	t.Helper()
	scheme, _ := Scheme()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	ca, err := cache.New(cfg, cache.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	if err := setupIndexes(ctx, ca); err != nil {
		t.Fatal(err)
	}
	go func() { _ = ca.Start(ctx) }()
	if !ca.WaitForCacheSync(ctx) {
		t.Fatal("informer cache did not sync")
	}
	if cached, err = client.NewWithWatch(cfg, client.Options{Scheme: scheme, Cache: &client.CacheOptions{Reader: ca}}); err != nil {
		t.Fatal(err)
	}
	if direct, err = client.New(cfg, client.Options{Scheme: scheme}); err != nil {
		t.Fatal(err)
	}
	return cached, direct
}

// caughtUp explains how the cached ServiceL2Status objects of testNS differ
// from the API server's (names and resource versions; "" when they match).
func caughtUp(t *testing.T, cached, direct client.Client) func() string {
	return func() string {
		versions := func(c client.Client) string {
			var vs []string
			for _, s := range statuses(t, c) {
				vs = append(vs, s.Name+"@"+s.ResourceVersion)
			}
			slices.Sort(vs) // the cache lists in no particular order
			return strings.Join(vs, " ")
		}
		if c, d := versions(cached), versions(direct); c != d {
			return fmt.Sprintf("cache has [%s], the API server [%s]", c, d)
		}
		return ""
	}
}

// checkOwner explains how the ServiceL2Status objects differ from exactly one
// object for ns1/web owned by owner ("" when they match).
func checkOwner(t *testing.T, c client.Client, owner string) func() string {
	return func() string {
		items := statuses(t, c)
		if len(items) != 1 {
			return describeStatuses(items)
		}
		s := items[0]
		switch {
		case s.Status.Node != owner, s.Labels[v1beta1.ServiceL2StatusNodeLabel] != owner:
			return "wrong node: " + describeStatuses(items)
		case s.Status.ServiceName != "web" || s.Status.ServiceNamespace != "ns1":
			return "wrong service: " + describeStatuses(items)
		case s.Labels[v1beta1.ServiceL2StatusServiceNameLabel] != "web" || s.Labels[v1beta1.ServiceL2StatusServiceNamespaceLabel] != "ns1":
			return "wrong labels: " + describeStatuses(items)
		case !strings.HasPrefix(s.Name, "l2-"):
			return "name not from generateName l2-: " + s.Name
		case len(s.OwnerReferences) != 1 || s.OwnerReferences[0].Kind != "Node" || s.OwnerReferences[0].Name != owner:
			// The Node, not the speaker Pod: the record outlives a speaker
			// restart, which moves nothing.
			return fmt.Sprintf("owner references %+v", s.OwnerReferences)
		case len(s.Status.Interfaces) != 1 || s.Status.Interfaces[0].Name != "eth0":
			return fmt.Sprintf("interfaces %+v", s.Status.Interfaces)
		}
		return ""
	}
}

// freeUDPTCPPort finds a port free for TCP and UDP on every given address.
func freeUDPTCPPort(t testing.TB, addrs ...string) int {
	t.Helper()
	for i := 0; i < 50; i++ {
		ln, err := net.Listen("tcp", addrs[0]+":0")
		if err != nil {
			t.Fatal(err)
		}
		port := ln.Addr().(*net.TCPAddr).Port
		_ = ln.Close() // only probed for a free port
		ok := true
		for _, a := range addrs {
			hp := net.JoinHostPort(a, fmt.Sprint(port))
			l, err1 := net.Listen("tcp", hp)
			u, err2 := net.ListenPacket("udp", hp)
			if l != nil {
				_ = l.Close()
			}
			if u != nil {
				_ = u.Close()
			}
			if err1 != nil || err2 != nil {
				ok = false
			}
		}
		if ok {
			return port
		}
	}
	t.Fatal("no free port")
	return 0
}

// TestRestartWithoutValidConfiguration: a speaker that restarts while the
// configuration does not parse has none to answer with. It tells the others
// so in its memberlist metadata, and they treat it as away (held while its
// kernel answers, its deputy answering for it; here, where nothing can probe
// the data path, its IP moves), instead of counting as serving a node that
// answers nobody. `ironlb status` reports it. Once the configuration parses
// again it answers, and nothing moves back.
func TestRestartWithoutValidConfiguration(t *testing.T) {
	if testing.Short() {
		t.Skip("envtest: skipped in -short mode")
	}
	cfg, c, _ := startEnv(t)
	ctx := context.Background()
	port := freeUDPTCPPort(t, "127.0.0.1", "127.0.0.2")
	nodes, _, _ := seed(t, c)
	speakers := runSpeakers(t, cfg, nodes, port)
	winner := election.Rank(testVIP, []string{"w1", "w2"})[0]
	other := map[string]string{"w1": "w2", "w2": "w1"}[winner]
	eventually(t, "one ServiceL2Status from the elected node "+winner, 60*time.Second, checkOwner(t, c, winner))
	speakers.waitReady(t)

	// What the other speaker's /status says of winner's member.
	view := func() (statusview.Snapshot, string) {
		url := strings.TrimSuffix(speakers.readyz[other], "/readyz") + statusview.Path
		resp, err := http.Get(url)
		if err != nil {
			return statusview.Snapshot{}, err.Error()
		}
		defer func() { _ = resp.Body.Close() }()
		var snap statusview.Snapshot
		if err := json.NewDecoder(resp.Body).Decode(&snap); err != nil {
			return snap, err.Error()
		}
		return snap, ""
	}
	member := func(notAnswering bool) func() string {
		return func() string {
			snap, err := view()
			if err != "" {
				return err
			}
			for _, m := range snap.Members {
				if m.Name == winner && m.NotAnswering == notAnswering {
					return ""
				}
			}
			return fmt.Sprintf("%s's members: %+v", other, snap.Members)
		}
	}

	// The configuration stops parsing; the running speakers keep the last
	// valid one. Then the owner restarts: it has none.
	overlap := &v1beta1.IPAddressPool{ObjectMeta: metav1.ObjectMeta{Namespace: testNS, Name: "overlap"},
		Spec: v1beta1.IPAddressPoolSpec{Addresses: []string{"172.18.255.240/28"}}}
	create(t, c, overlap)
	speakers.stop(winner)
	stop, restarted := runSpeaker(t, cfg, winner, nodes[winner], port)
	defer stop()
	eventually(t, winner+" ready, a member that says it answers for nothing", 60*time.Second, func() string {
		if msg := readyz(restarted)(); msg != "" {
			return msg
		}
		return member(true)()
	})
	eventually(t, other+" answers for the IP", 30*time.Second, announcedBy(other, true))
	snap, _ := view()
	problems := statusview.Merge(time.Now(), []statusview.Source{{Node: other, Snapshot: &snap}}).Problems
	if !slices.ContainsFunc(problems, func(p statusview.Problem) bool { return p.Kind == statusview.ProblemNotAnswering }) {
		t.Errorf("the status report does not show %s answering for nothing: %+v", winner, problems)
	}

	// Valid again: it answers, and nothing moves back.
	if err := c.Delete(ctx, overlap); err != nil {
		t.Fatal(err)
	}
	eventually(t, winner+" answers again", 60*time.Second, member(false))
	for end := time.Now().Add(3 * time.Second); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
		if msg := announcedBy(other, true)(); msg != "" {
			t.Fatalf("after the configuration was fixed: %s", msg)
		}
	}
}
