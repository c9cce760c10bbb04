// Command controller-bench measures the ironlb controller against a real API server
// (envtest: kube-apiserver + etcd from ./bin), with the controller running as its own
// process (`ironlb controller`), so its memory is measured alone:
//
//  1. create -> IP latency: Services created one at a time; time from the create
//     request to the IP seen in status through a watch (p50, p99, max);
//  2. bulk: N Services created concurrently; time until every one has an IP, and
//     the controller's peak RSS (VmHWM);
//  3. restart: the controller is stopped and a new one started with the N Services
//     in place; time until it has reconciled them all (its reconcile counter covers
//     every Service and its queue is empty) and how many IPs changed (must be 0).
//
// Run it from the repository root: go run ./test/bench/controller (or make bench-controller).
package main

import (
	"bufio"
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
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

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/ironlb/ironlb/api/v1beta1"
	"github.com/ironlb/ironlb/controllers"
)

// controllerArgs are appended to every `ironlb controller` command line.
var controllerArgs []string

// heapProfilePath, when set, receives the restarted controller's heap profile.
var heapProfilePath string

// cpuProfileDir, when set with -backlog, receives CPU profiles of the API server
// and the controller over the first cpuProfileSeconds of the controller's allocation.
var (
	cpuProfileDir     string
	cpuProfileSeconds int
)

const (
	installNS = "ironlb-system"
	benchNS   = "bench"
)

func main() {
	var (
		latencyN    = flag.Int("latency-services", 200, "services created one at a time for the create->IP latency")
		bulkN       = flag.Int("services", 10000, "services created concurrently for the bulk and restart phases")
		parallel    = flag.Int("create-parallelism", 16, "concurrent create requests in the bulk phase")
		metricsPort = flag.Int("metrics-port", 19120, "metrics port of the controller under test (plain HTTP, loopback)")
		keep        = flag.Bool("keep-logs", false, "keep the controller logs directory")
		extraArgs   = flag.String("controller-args", "", "extra flags for `ironlb controller`, space separated (e.g. --service-workers=16)")
		heapProfile = flag.String("heap-profile", "", "write the restarted controller's heap profile (after it reconciled everything) to this file")
		profileDir  = flag.String("cpu-profiles", "", "with -backlog: write CPU profiles of the API server and the controller, taken while the controller allocates, to apiserver.prof and controller.prof in this directory")
		profileSecs = flag.Int("cpu-profile-seconds", 15, "length of the -cpu-profiles profiles")
		backlog     = flag.Bool("backlog", false, "create the bulk Services while the controller is stopped, then start it: measures the controller's own allocation throughput")
	)
	flag.Parse()
	controllerArgs = strings.Fields(*extraArgs)
	heapProfilePath = *heapProfile
	cpuProfileDir, cpuProfileSeconds = *profileDir, *profileSecs
	if err := run(*latencyN, *bulkN, *parallel, *metricsPort, *keep, *backlog); err != nil {
		fmt.Fprintln(os.Stderr, "controller-bench:", err)
		os.Exit(1)
	}
}

func run(latencyN, bulkN, parallel, metricsPort int, keep, backlog bool) error {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	root, err := os.Getwd()
	if err != nil {
		return err
	}
	bin := filepath.Join(root, "bin")
	for _, b := range []string{"kube-apiserver", "etcd"} {
		if _, err := os.Stat(filepath.Join(bin, b)); err != nil {
			return fmt.Errorf("needs %s (make tools): %w", filepath.Join(bin, b), err)
		}
	}
	work, err := os.MkdirTemp("", "ironlb-bench-")
	if err != nil {
		return err
	}
	if !keep {
		defer func() {
			if err := os.RemoveAll(work); err != nil {
				fmt.Fprintln(os.Stderr, "controller-bench: removing the work directory:", err)
			}
		}()
	}

	fmt.Println("# building ironlb")
	ironlb := filepath.Join(work, "ironlb")
	if out, err := exec.Command("go", "build", "-o", ironlb, "./cmd/ironlb").CombinedOutput(); err != nil {
		return fmt.Errorf("building ironlb: %w\n%s", err, out)
	}

	fmt.Println("# starting envtest")
	env := &envtest.Environment{
		CRDDirectoryPaths:     []string{filepath.Join(root, "config", "crd", "bases")},
		ErrorIfCRDPathMissing: true,
		BinaryAssetsDirectory: bin,
		Scheme:                controllers.Scheme(),
	}
	// Room for the Services' cluster IPs (the envtest default is a /24).
	env.ControlPlane.GetAPIServer().Configure().Set("service-cluster-ip-range", "10.96.0.0/16")
	cfg, err := env.Start()
	if err != nil {
		return fmt.Errorf("starting envtest: %w", err)
	}
	defer env.Stop() //nolint:errcheck
	cfg.QPS, cfg.Burst = 1000, 2000
	user, err := env.AddUser(envtest.User{Name: "ironlb-controller", Groups: []string{"system:masters"}}, cfg)
	if err != nil {
		return fmt.Errorf("adding the controller's user: %w", err)
	}
	kc, err := user.KubeConfig()
	if err != nil {
		return err
	}
	kubeconfig := filepath.Join(work, "kubeconfig")
	if err := os.WriteFile(kubeconfig, kc, 0o600); err != nil {
		return err
	}

	c, err := client.New(cfg, client.Options{Scheme: controllers.Scheme()})
	if err != nil {
		return err
	}
	for _, ns := range []string{installNS, benchNS} {
		if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
			return err
		}
	}
	if err := c.Create(ctx, &v1beta1.IPAddressPool{
		ObjectMeta: metav1.ObjectMeta{Namespace: installNS, Name: "bench"},
		Spec:       v1beta1.IPAddressPoolSpec{Addresses: []string{"172.20.0.0/16"}},
	}); err != nil {
		return err
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
		return err
	}
	go inf.Run(ctx.Done())
	toolscache.WaitForCacheSync(ctx.Done(), inf.HasSynced)

	ctl, err := startController(ironlb, kubeconfig, work, "controller-1.log", metricsPort)
	if err != nil {
		return err
	}
	defer ctl.kill()
	if err := waitPoolLoaded(ctx, c, 2*time.Minute); err != nil {
		return err
	}
	fmt.Printf("# machine: %d CPUs, %s; services: latency %d, bulk %d\n", runtime.NumCPU(), kernel(), latencyN, bulkN)

	// 1. Latency, one Service at a time.
	lat := make([]time.Duration, 0, latencyN)
	for i := range latencyN {
		name := fmt.Sprintf("lat-%04d", i)
		start := time.Now()
		ch := w.expect(name)
		if err := c.Create(ctx, benchService(name)); err != nil {
			return fmt.Errorf("creating %s: %w", name, err)
		}
		select {
		case <-ch:
			lat = append(lat, time.Since(start))
		case <-time.After(60 * time.Second):
			return fmt.Errorf("service %s got no IP within 60s", name)
		}
	}
	slices.Sort(lat)
	fmt.Printf("create->IP latency over %d services: p50 %s  p99 %s  max %s\n",
		len(lat), pct(lat, 50), pct(lat, 99), lat[len(lat)-1])

	// 2. Bulk.
	target := int64(latencyN + bulkN)
	apiCPU0, etcdCPU0, selfCPU0 := cpuTime(childPid("kube-apiserver")), cpuTime(childPid("etcd")), cpuTime(os.Getpid())
	if backlog {
		if err := ctl.stop(); err != nil {
			return err
		}
	}
	var served0 map[string]float64
	start := time.Now()
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, parallel)
	for range parallel {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := next.Add(1) - 1
				if i >= int64(bulkN) {
					return
				}
				name := fmt.Sprintf("bulk-%05d", i)
				if err := c.Create(ctx, benchService(name)); err != nil {
					errs <- fmt.Errorf("creating %s: %w", name, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	created := time.Since(start)
	select {
	case err := <-errs:
		return err
	default:
	}
	fmt.Printf("bulk: %d services created in %s (%.0f creates/s, %d in parallel)\n",
		bulkN, created.Round(time.Millisecond), float64(bulkN)/created.Seconds(), parallel)
	lastCreate := time.Now()
	if backlog {
		// Counted from here, the API server serves only the controller (and the
		// watch the benchmark already holds).
		if served0, err = apiRequests(ctx, cs.CoreV1().RESTClient()); err != nil {
			return err
		}
		apiCPU0, etcdCPU0, selfCPU0 = cpuTime(childPid("kube-apiserver")), cpuTime(childPid("etcd")), cpuTime(os.Getpid())
		if cpuProfileDir != "" {
			secs := strconv.Itoa(cpuProfileSeconds)
			go saveProfile(func() ([]byte, error) {
				return cs.CoreV1().RESTClient().Get().AbsPath("/debug/pprof/profile").Param("seconds", secs).
					Timeout(time.Duration(cpuProfileSeconds+30) * time.Second).DoRaw(ctx)
			}, filepath.Join(cpuProfileDir, "apiserver.prof"))
			go saveProfile(func() ([]byte, error) {
				// The controller is started just below; give its pprof endpoint a moment.
				time.Sleep(300 * time.Millisecond)
				resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/debug/pprof/profile?seconds=%s", metricsPort+1, secs))
				if err != nil {
					return nil, err
				}
				defer func() { _ = resp.Body.Close() }()
				return io.ReadAll(resp.Body)
			}, filepath.Join(cpuProfileDir, "controller.prof"))
		}
		if ctl, err = startController(ironlb, kubeconfig, work, "controller-1b.log", metricsPort); err != nil {
			return err
		}
		defer ctl.kill()
	}
	if err := w.waitCount(target, 10*time.Minute); err != nil {
		return err
	}
	total := time.Since(start)
	hwm, rss := ctl.memory()
	if backlog {
		d := time.Since(lastCreate)
		fmt.Printf("bulk (backlog): controller started with %d pending services; all %d have an IP %s after process start (%.0f services/s)\n",
			bulkN, target, d.Round(time.Millisecond), float64(bulkN)/d.Seconds())
	} else {
		fmt.Printf("bulk (live): all %d have an IP %s after the first create, %s after the last create returned\n",
			target, total.Round(time.Millisecond), time.Since(lastCreate).Round(time.Millisecond))
	}
	fmt.Printf("controller memory with %d services: peak RSS (VmHWM) %s; now %s\n", target, hwm, rss)

	if err := printClientStats(metricsPort); err != nil {
		return err
	}
	if backlog {
		served, err := apiRequests(ctx, cs.CoreV1().RESTClient())
		if err != nil {
			return err
		}
		fmt.Printf("API server requests served while the controller allocated, per pending service: %s\n",
			perService(served0, served, bulkN))
	}
	apiCPU, etcdCPU, selfCPU := cpuTime(childPid("kube-apiserver"))-apiCPU0, cpuTime(childPid("etcd"))-etcdCPU0, cpuTime(os.Getpid())-selfCPU0
	phase := "the bulk phase (creates + allocation)"
	if backlog {
		phase = "allocation (from the controller's start)"
	}
	fmt.Printf("CPU used during %s: controller %s (%s/service); kube-apiserver %s (%s/service); etcd %s; benchmark %s\n",
		phase, cpuTime(ctl.cmd.Process.Pid).Round(10*time.Millisecond), (cpuTime(ctl.cmd.Process.Pid) / time.Duration(bulkN)).Round(10*time.Microsecond),
		apiCPU.Round(10*time.Millisecond), (apiCPU / time.Duration(bulkN)).Round(10*time.Microsecond), etcdCPU.Round(10*time.Millisecond),
		selfCPU.Round(10*time.Millisecond))

	// 3. Restart.
	before := w.snapshot()
	if err := ctl.stop(); err != nil {
		return err
	}
	restartStart := time.Now()
	ctl, err = startController(ironlb, kubeconfig, work, "controller-2.log", metricsPort)
	if err != nil {
		return err
	}
	defer ctl.kill()
	if err := waitReconciled(metricsPort, target, 10*time.Minute); err != nil {
		return err
	}
	reconciled := time.Since(restartStart)
	if heapProfilePath != "" {
		if err := fetch(fmt.Sprintf("http://127.0.0.1:%d/debug/pprof/heap", metricsPort+1), heapProfilePath); err != nil {
			return err
		}
	}
	hwm2, _ := ctl.memory()
	after := w.snapshot()
	changed := 0
	for k, v := range before {
		if after[k] != v {
			changed++
		}
	}
	fmt.Printf("restart with %d services: reconciled all %s after process start; IPs changed: %d; peak RSS %s\n",
		target, reconciled.Round(time.Millisecond), changed, hwm2)
	if changed != 0 {
		return fmt.Errorf("%d services changed IP across the restart", changed)
	}
	if keep {
		fmt.Println("# logs in", work)
	}
	return nil
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

// proc is a running `ironlb controller`.
type proc struct {
	cmd  *exec.Cmd
	done chan error
}

func startController(ironlb, kubeconfig, dir, logName string, metricsPort int) (*proc, error) {
	logf, err := os.Create(filepath.Join(dir, logName))
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(ironlb, "controller",
		"--kubeconfig", kubeconfig,
		"--namespace", installNS,
		"--webhook-mode", "disabled",
		"--leader-elect=false",
		"--port", strconv.Itoa(metricsPort), "--metrics-bind-host", "127.0.0.1", "--metrics-secure=false",
		"--health-probe-port", "0",
		"--pprof-bind-address", fmt.Sprintf("127.0.0.1:%d", metricsPort+1),
	)
	cmd.Args = append(cmd.Args, controllerArgs...)
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting %s: %w", ironlb, err)
	}
	p := &proc{cmd: cmd, done: make(chan error, 1)}
	go func() {
		err := cmd.Wait()
		_ = logf.Close() // the controller's log; it has exited, nothing more to flush
		p.done <- err
	}()
	return p, nil
}

func (p *proc) stop() error {
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-p.done:
		if err != nil {
			fmt.Fprintln(os.Stderr, "controller-bench: controller exit status after SIGTERM:", err)
		}
		return nil
	case <-time.After(60 * time.Second):
		p.kill()
		return errors.New("controller did not stop within 60s of SIGTERM")
	}
}

func (p *proc) kill() {
	if p.cmd.ProcessState == nil {
		_ = p.cmd.Process.Kill()
	}
}

// memory reads the controller's peak and current resident set size.
func (p *proc) memory() (hwm, rss string) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", p.cmd.Process.Pid))
	if err != nil {
		return "?", "?"
	}
	defer func() { _ = f.Close() }()
	s := bufio.NewScanner(f)
	for s.Scan() {
		k, v, _ := strings.Cut(s.Text(), ":")
		switch k {
		case "VmHWM":
			hwm = strings.Join(strings.Fields(v), " ")
		case "VmRSS", "RssAnon", "RssFile":
			if rss != "" {
				rss += ", "
			}
			rss += k + " " + strings.Join(strings.Fields(v), " ")
		}
	}
	return hwm, rss
}

// waitReconciled polls the controller's metrics until its service controller has
// completed at least n reconciles and its queue is empty.
func waitReconciled(port int, n int64, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	url := fmt.Sprintf("http://127.0.0.1:%d/metrics", port)
	var last string
	for time.Now().Before(deadline) {
		resp, err := http.Get(url)
		if err == nil {
			body, _ := io.ReadAll(resp.Body)
			_ = resp.Body.Close()
			total := metricSum(string(body), "controller_runtime_reconcile_total", `controller="service"`)
			depth := metricSum(string(body), "workqueue_depth", `name="service"`)
			last = fmt.Sprintf("reconciles %v, queue depth %v", total, depth)
			if total >= float64(n) && depth == 0 {
				return nil
			}
		} else {
			last = err.Error()
		}
		time.Sleep(20 * time.Millisecond)
	}
	return fmt.Errorf("restart: not reconciled within %s (%s)", timeout, last)
}

// metricSum adds the values of every sample of name whose labels contain match.
func metricSum(text, name, match string) float64 {
	var sum float64
	for _, line := range strings.Split(text, "\n") {
		if !strings.HasPrefix(line, name+"{") || !strings.Contains(line, match) {
			continue
		}
		f := strings.Fields(line)
		if v, err := strconv.ParseFloat(f[len(f)-1], 64); err == nil {
			sum += v
		}
	}
	return sum
}

func pct(sorted []time.Duration, p int) time.Duration {
	i := (len(sorted)*p + 99) / 100
	if i > 0 {
		i--
	}
	return sorted[i].Round(10 * time.Microsecond)
}

func kernel() string {
	b, err := os.ReadFile("/proc/sys/kernel/osrelease")
	if err != nil {
		return runtime.GOOS
	}
	return "Linux " + strings.TrimSpace(string(b))
}

// waitPoolLoaded waits until the controller has loaded its configuration, which it
// reports in the pool's Ready condition, so the latency phase does not time the
// controller's start-up.
func waitPoolLoaded(ctx context.Context, c client.Client, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		var p v1beta1.IPAddressPool
		if err := c.Get(ctx, client.ObjectKey{Namespace: installNS, Name: "bench"}, &p); err == nil {
			for _, cond := range p.Status.Conditions {
				if cond.Type == controllers.ConditionReady && cond.Status == metav1.ConditionTrue {
					return nil
				}
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	return fmt.Errorf("the controller did not load the configuration within %s", timeout)
}

// printClientStats shows how many requests the controller made, by method, and how
// long client-side rate limiting delayed them: the cost per Service.
func printClientStats(port int) error {
	resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/metrics", port))
	if err != nil {
		return fmt.Errorf("reading controller metrics: %w", err)
	}
	defer func() { _ = resp.Body.Close() }()
	body, _ := io.ReadAll(resp.Body)
	text := string(body)
	var parts []string
	for _, m := range []string{"GET", "LIST", "PATCH", "POST", "PUT", "WATCH"} {
		if v := metricSum(text, "rest_client_requests_total", `method="`+m+`"`); v > 0 {
			parts = append(parts, fmt.Sprintf("%s %.0f", m, v))
		}
	}
	fmt.Printf("controller API requests: %s; client rate-limiter wait total %.1fs\n",
		strings.Join(parts, ", "), metricSum(text, "rest_client_rate_limiter_duration_seconds_sum", ""))
	return nil
}

// apiRequests reads the API server's apiserver_request_total, summed by verb,
// resource and subresource ("PATCH services/status"): every client's requests, counted
// where they are served, so any controller can be measured the same way.
func apiRequests(ctx context.Context, rc rest.Interface) (map[string]float64, error) {
	body, err := rc.Get().AbsPath("/metrics").DoRaw(ctx)
	if err != nil {
		return nil, fmt.Errorf("reading the API server's metrics: %w", err)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	families, err := p.TextToMetricFamilies(strings.NewReader(string(body)))
	if err != nil {
		return nil, fmt.Errorf("parsing the API server's metrics: %w", err)
	}
	out := map[string]float64{}
	fam, ok := families["apiserver_request_total"]
	if !ok {
		return nil, errors.New("the API server's metrics have no apiserver_request_total")
	}
	for _, m := range fam.GetMetric() {
		l := map[string]string{}
		for _, lp := range m.GetLabel() {
			l[lp.GetName()] = lp.GetValue()
		}
		key := l["verb"] + " " + l["resource"]
		if l["subresource"] != "" {
			key += "/" + l["subresource"]
		}
		out[key] += m.GetCounter().GetValue()
	}
	return out, nil
}

// perService formats the requests served between two apiRequests snapshots, per
// service, largest first; long-running WATCH requests and verbs under 0.01 per
// service are left out.
func perService(before, after map[string]float64, services int) string {
	type row struct {
		key string
		n   float64
	}
	var rows []row
	total := 0.0
	for k, v := range after {
		d := (v - before[k]) / float64(services)
		if d < 0.01 || strings.HasPrefix(k, "WATCH") {
			continue
		}
		rows = append(rows, row{k, d})
		total += d
	}
	slices.SortFunc(rows, func(a, b row) int {
		if a.n != b.n {
			return cmp.Compare(b.n, a.n)
		}
		return strings.Compare(a.key, b.key)
	})
	parts := []string{fmt.Sprintf("%.2f in all", total)}
	for _, r := range rows {
		parts = append(parts, fmt.Sprintf("%s %.2f", r.key, r.n))
	}
	return strings.Join(parts, ", ")
}

// cpuTime is the user+system CPU time a process has used.
func cpuTime(pid int) time.Duration {
	if pid <= 0 {
		return 0
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	// Fields after the command name (which is in parentheses and may hold spaces).
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
	if len(f) < 13 {
		return 0
	}
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(ut+st) * time.Second / 100 // USER_HZ is 100 on Linux
}

// childPid finds this process's child running the named binary (envtest's servers).
func childPid(name string) int {
	self := strconv.Itoa(os.Getpid())
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			continue
		}
		st := string(b)
		open, closing := strings.IndexByte(st, '('), strings.LastIndexByte(st, ')')
		if open < 0 || closing < open || st[open+1:closing] != name {
			continue
		}
		if f := strings.Fields(st[closing+1:]); len(f) > 1 && f[1] == self {
			return pid
		}
	}
	return 0
}

// saveProfile writes what get returns to path, reporting a failure without stopping
// the benchmark (a profile is a diagnostic, not a figure).
func saveProfile(get func() ([]byte, error), path string) {
	b, err := get()
	if err == nil {
		err = os.WriteFile(path, b, 0o600)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "controller-bench: CPU profile %s: %v\n", path, err)
	}
}

func fetch(url, path string) error {
	resp, err := http.Get(url)
	if err != nil {
		return fmt.Errorf("fetching %s: %w", url, err)
	}
	defer func() { _ = resp.Body.Close() }()
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	_, err = io.Copy(f, resp.Body)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}
