package controllers_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/ironlb/ironlb/api/v1beta1"
	"github.com/ironlb/ironlb/controllers"
)

// The suite shares one kube-apiserver + etcd (envtest, binaries from <repo>/bin).
// Every test gets its own install namespace (pools) and Service namespace, runs its
// own controller, and deletes its Services when it ends, so the next test's
// controller starts from a clean slate. Tests run one after another.
var (
	restCfg  *rest.Config
	k8s      client.Client
	skipWhy  string
	nsSerial atomic.Int64
)

// Cluster IP ranges of the test API server: dual-stack, and big enough for the
// benchmarks' 10,000 Services (the envtest default is a /24).
const serviceCIDRs = "10.96.0.0/16,fd00:10:96::/112"

func TestMain(m *testing.M) {
	os.Exit(runSuite(m))
}

func runSuite(m *testing.M) int {
	logf.SetLogger(testLog.logger())
	root, _ := filepath.Abs(filepath.Join(".."))
	bin := filepath.Join(root, "bin")
	if dir := os.Getenv("KUBEBUILDER_ASSETS"); dir != "" {
		bin = dir
	}
	for _, b := range []string{"kube-apiserver", "etcd"} {
		if _, err := os.Stat(filepath.Join(bin, b)); err != nil {
			skipWhy = fmt.Sprintf("envtest needs %s (build it with `make tools`): %v", filepath.Join(bin, b), err)
			return m.Run()
		}
	}
	env := &envtest.Environment{
		CRDDirectoryPaths:     []string{filepath.Join(root, "config", "crd", "bases")},
		ErrorIfCRDPathMissing: true,
		BinaryAssetsDirectory: bin,
		Scheme:                controllers.Scheme(),
	}
	env.ControlPlane.GetAPIServer().Configure().Set("service-cluster-ip-range", serviceCIDRs)
	cfg, err := env.Start()
	if err != nil {
		fmt.Fprintf(os.Stderr, "starting envtest: %v\n", err)
		return 1
	}
	defer func() {
		if err := env.Stop(); err != nil {
			fmt.Fprintf(os.Stderr, "stopping envtest: %v\n", err)
		}
	}()
	cfg.QPS, cfg.Burst = 500, 1000
	restCfg = cfg
	k8s, err = client.New(cfg, client.Options{Scheme: controllers.Scheme()})
	if err != nil {
		fmt.Fprintf(os.Stderr, "creating client: %v\n", err)
		return 1
	}
	return m.Run()
}

// testLog routes the controller's logs to the running test (shown on failure or
// with -v) and drops logs that arrive between tests.
var testLog = &logRouter{}

type logRouter struct {
	mu sync.Mutex
	t  *testing.T
}

func (r *logRouter) set(t *testing.T) {
	r.mu.Lock()
	r.t = t
	r.mu.Unlock()
}

func (r *logRouter) logger() logr.Logger {
	return funcr.New(func(prefix, args string) {
		r.mu.Lock()
		defer r.mu.Unlock()
		if r.t != nil {
			r.t.Log(prefix, args)
		}
	}, funcr.Options{Verbosity: 0})
}

// harness is one test's controller and namespaces.
type harness struct {
	t         *testing.T
	ctx       context.Context
	installNS string
	ns        string
	opts      controllers.Options

	cancel context.CancelFunc
	done   chan error
}

func newHarness(t *testing.T, mutate ...func(*controllers.Options)) *harness {
	t.Helper()
	if skipWhy != "" {
		t.Skip(skipWhy)
	}
	testLog.set(t)
	t.Cleanup(func() { testLog.set(nil) }) // registered first: runs last
	n := nsSerial.Add(1)
	h := &harness{
		t:         t,
		ctx:       context.Background(),
		installNS: fmt.Sprintf("ilb-system-%d", n),
		ns:        fmt.Sprintf("ilb-test-%d", n),
	}
	for _, ns := range []string{h.installNS, h.ns} {
		h.create(&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})
	}
	h.opts = controllers.Options{
		Namespace:            h.installNS,
		WebhookMode:          controllers.WebhookModeDisabled,
		MemberlistSecretName: "ironlb-memberlist",
		RESTConfig:           restCfg,
		Logger:               testLog.logger(),
	}
	for _, m := range mutate {
		m(&h.opts)
	}
	t.Cleanup(h.cleanup)
	return h
}

// start runs a controller until stop or the end of the test.
func (h *harness) start() {
	h.t.Helper()
	if h.cancel != nil {
		h.t.Fatal("controller already running")
	}
	ctx, cancel := context.WithCancel(context.Background())
	h.cancel, h.done = cancel, make(chan error, 1)
	go func() { h.done <- controllers.Run(ctx, h.opts) }()
}

// startExtra runs one more controller replica with the same options; the returned
// function stops it and waits for it.
func (h *harness) startExtra() func() {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- controllers.Run(ctx, h.opts) }()
	return func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				h.t.Errorf("extra controller returned: %v", err)
			}
		case <-time.After(60 * time.Second):
			h.t.Error("extra controller did not stop within 60s")
		}
	}
}

// stop stops the controller and waits until it has returned.
func (h *harness) stop() {
	h.t.Helper()
	if h.cancel == nil {
		return
	}
	h.cancel()
	select {
	case err := <-h.done:
		if err != nil {
			h.t.Errorf("controller returned: %v", err)
		}
	case <-time.After(60 * time.Second):
		h.t.Error("controller did not stop within 60s")
	}
	h.cancel = nil
}

func (h *harness) cleanup() {
	h.stop()
	// Services must go: the next test's controller would otherwise see them.
	_ = k8s.DeleteAllOf(h.ctx, &corev1.Service{}, client.InNamespace(h.ns))
	_ = k8s.DeleteAllOf(h.ctx, &v1beta1.IPAddressPool{}, client.InNamespace(h.installNS))
	_ = k8s.DeleteAllOf(h.ctx, &v1beta1.L2Advertisement{}, client.InNamespace(h.installNS))
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		var l corev1.ServiceList
		if err := k8s.List(h.ctx, &l, client.InNamespace(h.ns)); err == nil && len(l.Items) == 0 {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	h.t.Errorf("services of %s not deleted within 60s", h.ns)
}

func (h *harness) create(obj client.Object) {
	h.t.Helper()
	if err := k8s.Create(h.ctx, obj); err != nil {
		h.t.Fatalf("creating %T %s: %v", obj, obj.GetName(), err)
	}
}

func (h *harness) pool(name string, addrs ...string) *v1beta1.IPAddressPool {
	h.t.Helper()
	p := &v1beta1.IPAddressPool{
		ObjectMeta: metav1.ObjectMeta{Namespace: h.installNS, Name: name},
		Spec:       v1beta1.IPAddressPoolSpec{Addresses: addrs},
	}
	h.create(p)
	return p
}

func (h *harness) l2adv(name string) {
	h.t.Helper()
	h.create(&v1beta1.L2Advertisement{ObjectMeta: metav1.ObjectMeta{Namespace: h.installNS, Name: name}})
}

// service returns a LoadBalancer Service (not created) with one TCP port. Node
// ports are off: envtest has no nodes and the node port range is small.
func (h *harness) service(name string, annotations map[string]string, ports ...corev1.ServicePort) *corev1.Service {
	if len(ports) == 0 {
		ports = []corev1.ServicePort{{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP, TargetPort: intstr.FromInt32(80)}}
	}
	return &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: h.ns, Name: name, Annotations: annotations},
		Spec: corev1.ServiceSpec{
			Type:                          corev1.ServiceTypeLoadBalancer,
			Selector:                      map[string]string{"app": name},
			Ports:                         ports,
			AllocateLoadBalancerNodePorts: ptr.To(false),
		},
	}
}

func (h *harness) get(name string) *corev1.Service {
	h.t.Helper()
	var svc corev1.Service
	if err := k8s.Get(h.ctx, client.ObjectKey{Namespace: h.ns, Name: name}, &svc); err != nil {
		h.t.Fatalf("getting service %s: %v", name, err)
	}
	return &svc
}

func ingress(svc *corev1.Service) []string {
	var ips []string
	for _, ing := range svc.Status.LoadBalancer.Ingress {
		ips = append(ips, ing.IP)
	}
	return ips
}

// eventually polls cond every 100ms until it holds or the deadline passes; then
// it fails the test with cond's last explanation and the namespace's events.
func (h *harness) eventually(what string, cond func() (bool, string)) {
	h.t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	var why string
	for {
		var ok bool
		ok, why = cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	h.dump()
	h.t.Fatalf("timed out waiting for %s: %s", what, why)
}

// waitIPs waits until the service shows exactly ips in its status.
func (h *harness) waitIPs(name string, ips ...string) *corev1.Service {
	h.t.Helper()
	var svc *corev1.Service
	h.eventually(fmt.Sprintf("service %s to get %v", name, ips), func() (bool, string) {
		svc = h.get(name)
		got := ingress(svc)
		return strings.Join(got, ",") == strings.Join(ips, ","), fmt.Sprintf("status shows %v", got)
	})
	return svc
}

// waitEvent waits for an event on the service with this type and reason whose
// message contains every fragment, and returns it.
func (h *harness) waitEvent(name, eventType, reason string, fragments ...string) corev1.Event {
	h.t.Helper()
	var found corev1.Event
	h.eventually(fmt.Sprintf("%s event %s on %s containing %q", eventType, reason, name, fragments), func() (bool, string) {
		evs := h.events(name)
		for _, e := range evs {
			if e.Type != eventType || e.Reason != reason {
				continue
			}
			ok := true
			for _, f := range fragments {
				ok = ok && strings.Contains(e.Message, f)
			}
			if ok {
				found = e
				return true, ""
			}
		}
		return false, fmt.Sprintf("%d events on %s", len(evs), name)
	})
	return found
}

// events lists the events about one service, oldest first.
func (h *harness) events(name string) []corev1.Event {
	h.t.Helper()
	var l corev1.EventList
	if err := k8s.List(h.ctx, &l, client.InNamespace(h.ns)); err != nil {
		h.t.Fatalf("listing events: %v", err)
	}
	var out []corev1.Event
	for _, e := range l.Items {
		if e.InvolvedObject.Name == name && e.InvolvedObject.Kind == "Service" {
			out = append(out, e)
		}
	}
	sort.SliceStable(out, func(i, j int) bool { return eventTime(out[i]).Before(eventTime(out[j])) })
	return out
}

func eventTime(e corev1.Event) time.Time {
	if !e.EventTime.IsZero() {
		return e.EventTime.Time
	}
	return e.FirstTimestamp.Time
}

// countEvents counts events on name with this reason (a series counts its repeats).
func (h *harness) countEvents(name, reason string) int {
	n := 0
	for _, e := range h.events(name) {
		if e.Reason != reason {
			continue
		}
		switch {
		case e.Series != nil:
			n += int(e.Series.Count)
		case e.Count > 1:
			n += int(e.Count)
		default:
			n++
		}
	}
	return n
}

// dump logs the services and events of the test namespace, to explain a failure.
func (h *harness) dump() {
	var svcs corev1.ServiceList
	_ = k8s.List(h.ctx, &svcs, client.InNamespace(h.ns))
	for _, s := range svcs.Items {
		h.t.Logf("service %s: type=%s class=%v ingress=%v annotations=%v", s.Name, s.Spec.Type,
			ptr.Deref(s.Spec.LoadBalancerClass, ""), ingress(&s), s.Annotations)
	}
	var evs corev1.EventList
	_ = k8s.List(h.ctx, &evs, client.InNamespace(h.ns))
	for _, e := range evs.Items {
		h.t.Logf("event %s/%s %s %s: %s", e.InvolvedObject.Kind, e.InvolvedObject.Name, e.Type, e.Reason, e.Message)
	}
	var pools v1beta1.IPAddressPoolList
	_ = k8s.List(h.ctx, &pools, client.InNamespace(h.installNS))
	for _, p := range pools.Items {
		h.t.Logf("pool %s: spec=%+v status=%+v", p.Name, p.Spec, p.Status)
	}
}

// poolStatus waits for the pool's status to show these counts.
func (h *harness) waitPoolStatus(name string, assigned4, available4, assigned6, available6 int64) v1beta1.IPAddressPool {
	h.t.Helper()
	var p v1beta1.IPAddressPool
	h.eventually("pool "+name+" status", func() (bool, string) {
		if err := k8s.Get(h.ctx, client.ObjectKey{Namespace: h.installNS, Name: name}, &p); err != nil {
			return false, err.Error()
		}
		s := p.Status
		return s.AssignedIPv4 == assigned4 && s.AvailableIPv4 == available4 && s.AssignedIPv6 == assigned6 && s.AvailableIPv6 == available6,
			fmt.Sprintf("status %+v", s)
	})
	return p
}

func (h *harness) update(name string, mutate func(*corev1.Service)) {
	h.t.Helper()
	for i := 0; ; i++ {
		svc := h.get(name)
		mutate(svc)
		err := k8s.Update(h.ctx, svc)
		if err == nil {
			return
		}
		if !apierrors.IsConflict(err) || i > 20 {
			h.t.Fatalf("updating service %s: %v", name, err)
		}
	}
}
