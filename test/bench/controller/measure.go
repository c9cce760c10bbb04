package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	kruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/ironlb/ironlb/api/v1beta1"
	"github.com/ironlb/ironlb/controllers"
)

const benchNS = "bench"

// result is what one controller's run measured.
type result struct {
	name string
	// latency is the sorted create -> IP latency of the Services created one at a time.
	latency []time.Duration
	// allocated is the time until all bulk Services had an IP: from the
	// controller's start with -backlog, from the first create without.
	allocated time.Duration
	// requestsPerService and requestTotal are the API server's requests per bulk
	// Service while the controller allocated (-backlog only).
	requestsPerService string
	requestTotal       float64
	// CPU while the controller allocated (-backlog) or during the bulk phase.
	controllerCPU, apiserverCPU, etcdCPU time.Duration
	peakRSSkB                            int64
}

// measure runs the three phases for one controller on a fresh API server.
func measure(ctx context.Context, cut *controllerUnderTest, o options, bin, work string) (*result, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	res := &result{name: cut.name}
	fmt.Println("# starting envtest")
	env := &envtest.Environment{
		CRDDirectoryPaths:     cut.crdDirs,
		ErrorIfCRDPathMissing: true,
		BinaryAssetsDirectory: bin,
		Scheme:                controllers.Scheme(),
	}
	// Room for the Services' cluster IPs (the envtest default is a /24).
	env.ControlPlane.GetAPIServer().Configure().Set("service-cluster-ip-range", "10.96.0.0/16")
	cfg, err := env.Start()
	if err != nil {
		return nil, fmt.Errorf("starting envtest: %w", err)
	}
	defer env.Stop() //nolint:errcheck
	cfg.QPS, cfg.Burst = 1000, 2000
	user, err := env.AddUser(envtest.User{Name: cut.key + "-controller", Groups: []string{"system:masters"}}, cfg)
	if err != nil {
		return nil, fmt.Errorf("adding the controller's user: %w", err)
	}
	kc, err := user.KubeConfig()
	if err != nil {
		return nil, err
	}
	kubeconfig := filepath.Join(work, cut.key+".kubeconfig")
	if err := os.WriteFile(kubeconfig, kc, 0o600); err != nil {
		return nil, err
	}

	c, err := client.New(cfg, client.Options{Scheme: controllers.Scheme()})
	if err != nil {
		return nil, err
	}
	for _, ns := range []string{cut.installNS, benchNS} {
		if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
			return nil, err
		}
	}
	// ironlb's IPAddressPool type is MetalLB's (metallb.io/v1beta1), so it serves both.
	if err := c.Create(ctx, &v1beta1.IPAddressPool{
		ObjectMeta: metav1.ObjectMeta{Namespace: cut.installNS, Name: "bench"},
		Spec:       v1beta1.IPAddressPoolSpec{Addresses: []string{"172.20.0.0/16"}},
	}); err != nil {
		return nil, err
	}

	w := newWatcher()
	// The benchmark's own watch asks for protobuf, as controllers do: a JSON
	// watch costs the shared API server more CPU per status write than the
	// controller under test.
	pcfg := rest.CopyConfig(cfg)
	pcfg.ContentType = kruntime.ContentTypeProtobuf
	pcfg.AcceptContentTypes = kruntime.ContentTypeProtobuf + "," + kruntime.ContentTypeJSON
	cs := kubernetes.NewForConfigOrDie(pcfg)
	lw := toolscache.NewListWatchFromClient(cs.CoreV1().RESTClient(), "services", benchNS, fields.Everything())
	inf := toolscache.NewSharedIndexInformer(lw, &corev1.Service{}, 0, toolscache.Indexers{})
	if _, err := inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc:    w.observe,
		UpdateFunc: func(_, o any) { w.observe(o) },
	}); err != nil {
		return nil, err
	}
	go inf.Run(ctx.Done())
	toolscache.WaitForCacheSync(ctx.Done(), inf.HasSynced)

	if cut.setup != nil {
		if err := cut.setup(ctx, c); err != nil {
			return nil, fmt.Errorf("preparing for the controller: %w", err)
		}
	}
	ctl, err := cut.start(kubeconfig, work, "1")
	if err != nil {
		return nil, err
	}
	defer ctl.kill()
	if err := waitPoolLoaded(ctx, c, ctl, cut.installNS, 2*time.Minute); err != nil {
		return nil, err
	}

	// 1. Latency, one Service at a time.
	lat := make([]time.Duration, 0, o.latencyN)
	for i := range o.latencyN {
		name := fmt.Sprintf("lat-%04d", i)
		start := time.Now()
		ch := w.expect(name)
		if err := c.Create(ctx, benchService(name)); err != nil {
			return nil, fmt.Errorf("creating %s: %w", name, err)
		}
		select {
		case <-ch:
			lat = append(lat, time.Since(start))
		case <-time.After(60 * time.Second):
			return nil, fmt.Errorf("service %s got no IP within 60s", name)
		}
	}
	slices.Sort(lat)
	res.latency = lat
	if len(lat) > 0 {
		fmt.Printf("create->IP latency over %d services: p50 %s  p99 %s  max %s\n",
			len(lat), pct(lat, 50), pct(lat, 99), lat[len(lat)-1])
	}

	// 2. Bulk.
	target := int64(o.latencyN + o.bulkN)
	apiCPU0, etcdCPU0, selfCPU0 := cpuTime(childPid("kube-apiserver")), cpuTime(childPid("etcd")), cpuTime(os.Getpid())
	if o.backlog {
		if err := ctl.stop(); err != nil {
			return nil, err
		}
	}
	start := time.Now()
	if err := createServices(ctx, c, o.bulkN, o.parallel); err != nil {
		return nil, err
	}
	created := time.Since(start)
	fmt.Printf("bulk: %d services created in %s (%.0f creates/s, %d in parallel)\n",
		o.bulkN, created.Round(time.Millisecond), float64(o.bulkN)/created.Seconds(), o.parallel)
	lastCreate := time.Now()
	var served0 map[string]float64
	if o.backlog {
		// Counted from here, the API server serves only the controller (and the
		// watch the benchmark already holds).
		if served0, err = apiRequests(ctx, cs.CoreV1().RESTClient()); err != nil {
			return nil, err
		}
		apiCPU0, etcdCPU0, selfCPU0 = cpuTime(childPid("kube-apiserver")), cpuTime(childPid("etcd")), cpuTime(os.Getpid())
		if o.cpuProfileDir != "" {
			profileAllocation(ctx, cs.CoreV1().RESTClient(), cut, o)
		}
		if ctl, err = cut.start(kubeconfig, work, "1b"); err != nil {
			return nil, err
		}
		defer ctl.kill()
	}
	if err := w.waitCount(target, 15*time.Minute); err != nil {
		return nil, err
	}
	total := time.Since(start)
	hwm, rss := ctl.memory()
	res.peakRSSkB = hwm
	if o.backlog {
		res.allocated = time.Since(lastCreate)
		fmt.Printf("bulk (backlog): controller started with %d pending services; all %d have an IP %s after process start (%.0f services/s)\n",
			o.bulkN, target, res.allocated.Round(time.Millisecond), float64(o.bulkN)/res.allocated.Seconds())
	} else {
		res.allocated = total
		fmt.Printf("bulk (live): all %d have an IP %s after the first create, %s after the last create returned\n",
			target, total.Round(time.Millisecond), time.Since(lastCreate).Round(time.Millisecond))
	}
	fmt.Printf("controller memory with %d services: peak RSS (VmHWM) %d kB; now %s\n", target, hwm, rss)

	if cut.metricsPort > 0 {
		if err := printClientStats(cut.metricsPort); err != nil {
			return nil, err
		}
	}
	if o.backlog {
		served, err := apiRequests(ctx, cs.CoreV1().RESTClient())
		if err != nil {
			return nil, err
		}
		res.requestsPerService, res.requestTotal = requestsPerService(served0, served, o.bulkN)
		fmt.Printf("API server requests served while the controller allocated, per pending service: %s\n", res.requestsPerService)
	}
	res.controllerCPU = ctl.cpu()
	res.apiserverCPU, res.etcdCPU = cpuTime(childPid("kube-apiserver"))-apiCPU0, cpuTime(childPid("etcd"))-etcdCPU0
	selfCPU := cpuTime(os.Getpid()) - selfCPU0
	phase := "the bulk phase (creates + allocation)"
	if o.backlog {
		phase = "allocation (from the controller's start)"
	}
	perSvc := func(d time.Duration) string { return perService(d, o.bulkN) }
	fmt.Printf("CPU used during %s: controller %s (%s/service); kube-apiserver %s (%s/service); etcd %s; benchmark %s; load average %s\n",
		phase, res.controllerCPU.Round(10*time.Millisecond), perSvc(res.controllerCPU),
		res.apiserverCPU.Round(10*time.Millisecond), perSvc(res.apiserverCPU), res.etcdCPU.Round(10*time.Millisecond),
		selfCPU.Round(10*time.Millisecond), loadAverage())

	if cut.metricsPort == 0 {
		fmt.Println("restart: not measured (the controller's metrics cannot be read)")
		return res, nil
	}
	return res, restart(ctx, cut, o, w, ctl, kubeconfig, work, target)
}

// restart stops the controller, starts a new one with every Service in place and
// checks that it reconciles them all without moving an IP.
func restart(ctx context.Context, cut *controllerUnderTest, o options, w *watcher, ctl *proc, kubeconfig, work string, target int64) error {
	before := w.snapshot()
	if err := ctl.stop(); err != nil {
		return err
	}
	restartStart := time.Now()
	ctl, err := cut.start(kubeconfig, work, "2")
	if err != nil {
		return err
	}
	defer ctl.kill()
	if err := waitReconciled(cut.metricsPort, target, 10*time.Minute); err != nil {
		return err
	}
	reconciled := time.Since(restartStart)
	if o.heapProfile != "" {
		if err := fetch(fmt.Sprintf("http://%s/debug/pprof/heap", cut.pprofAddr), o.heapProfile); err != nil {
			return err
		}
	}
	hwm, _ := ctl.memory()
	after := w.snapshot()
	changed := 0
	for k, v := range before {
		if after[k] != v {
			changed++
		}
	}
	fmt.Printf("restart with %d services: reconciled all %s after process start; IPs changed: %d; peak RSS %d kB\n",
		target, reconciled.Round(time.Millisecond), changed, hwm)
	if changed != 0 {
		return fmt.Errorf("%d services changed IP across the restart", changed)
	}
	return nil
}

// perService is d shared among n Services.
func perService(d time.Duration, n int) string {
	return (d / time.Duration(n)).Round(10 * time.Microsecond).String()
}

// createServices creates n bulk Services with parallel concurrent requests.
func createServices(ctx context.Context, c client.Client, n, parallel int) error {
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, parallel)
	for range parallel {
		wg.Go(func() {
			for {
				i := next.Add(1) - 1
				if i >= int64(n) {
					return
				}
				name := fmt.Sprintf("bulk-%05d", i)
				if err := c.Create(ctx, benchService(name)); err != nil {
					errs <- fmt.Errorf("creating %s: %w", name, err)
					return
				}
			}
		})
	}
	wg.Wait()
	select {
	case err := <-errs:
		return err
	default:
		return nil
	}
}

// profileAllocation starts CPU profiles of the API server and of the controller
// that is about to start, written to o.cpuProfileDir.
func profileAllocation(ctx context.Context, rc rest.Interface, cut *controllerUnderTest, o options) {
	secs := strconv.Itoa(o.cpuProfileSeconds)
	go saveProfile(func() ([]byte, error) {
		return rc.Get().AbsPath("/debug/pprof/profile").Param("seconds", secs).
			Timeout(time.Duration(o.cpuProfileSeconds+30) * time.Second).DoRaw(ctx)
	}, filepath.Join(o.cpuProfileDir, cut.key+"-apiserver.prof"))
	go saveProfile(func() ([]byte, error) {
		// The controller starts right after this; give its pprof endpoint a moment.
		time.Sleep(300 * time.Millisecond)
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, fmt.Sprintf("http://%s/debug/pprof/profile?seconds=%s", cut.pprofAddr, secs), nil)
		if err != nil {
			return nil, err
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return nil, err
		}
		defer func() { _ = resp.Body.Close() }()
		return io.ReadAll(resp.Body)
	}, filepath.Join(o.cpuProfileDir, cut.key+"-controller.prof"))
}

// waitPoolLoaded waits until the controller has loaded its configuration, which
// both ironlb and MetalLB report by writing the pool's available address count, so
// the latency phase does not time the controller's start-up.
func waitPoolLoaded(ctx context.Context, c client.Client, ctl *proc, ns string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		if done, err := ctl.exited(); done {
			if err == nil {
				err = errors.New("exit status 0")
			}
			return fmt.Errorf("the controller exited at start, see its log (-keep-logs): %w", err)
		}
		var p v1beta1.IPAddressPool
		if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: "bench"}, &p); err == nil && p.Status.AvailableIPv4 > 0 {
			return nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	return fmt.Errorf("the controller did not load the configuration (pool %s/bench shows no available address) within %s", ns, timeout)
}

func benchService(name string) *corev1.Service {
	return &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: benchNS, Name: name},
		Spec: corev1.ServiceSpec{
			Type:                          corev1.ServiceTypeLoadBalancer,
			Selector:                      map[string]string{"app": name},
			Ports:                         []corev1.ServicePort{{Port: 80, TargetPort: intstr.FromInt32(8080), Protocol: corev1.ProtocolTCP}},
			AllocateLoadBalancerNodePorts: ptr.To(false),
		},
	}
}

// watcher records each Service's first ingress IP as seen through a watch.
type watcher struct {
	mu      sync.Mutex
	ips     map[string]string
	waiters map[string]chan struct{}
	count   atomic.Int64
}

func newWatcher() *watcher {
	return &watcher{ips: map[string]string{}, waiters: map[string]chan struct{}{}}
}

func (w *watcher) observe(obj any) {
	svc, ok := obj.(*corev1.Service)
	if !ok {
		return
	}
	var ips []string
	for _, ing := range svc.Status.LoadBalancer.Ingress {
		ips = append(ips, ing.IP)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	prev, had := w.ips[svc.Name]
	cur := strings.Join(ips, ",")
	w.ips[svc.Name] = cur
	if cur != "" && (!had || prev == "") {
		w.count.Add(1)
		if ch, ok := w.waiters[svc.Name]; ok {
			close(ch)
			delete(w.waiters, svc.Name)
		}
	}
	if cur == "" && prev != "" {
		w.count.Add(-1)
	}
}

func (w *watcher) expect(name string) <-chan struct{} {
	w.mu.Lock()
	defer w.mu.Unlock()
	ch := make(chan struct{})
	w.waiters[name] = ch
	return ch
}

func (w *watcher) waitCount(n int64, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for w.count.Load() < n {
		if time.Now().After(deadline) {
			return fmt.Errorf("only %d of %d services got an IP within %s", w.count.Load(), n, timeout)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return nil
}

func (w *watcher) snapshot() map[string]string {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := make(map[string]string, len(w.ips))
	for k, v := range w.ips {
		out[k] = v
	}
	return out
}
