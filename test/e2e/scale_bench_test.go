//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"os"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/ironlb/ironlb/api/v1beta1"
	"github.com/ironlb/ironlb/internal/election"
	"github.com/ironlb/ironlb/test/lab/labctl"
	"github.com/ironlb/ironlb/test/procstat"
)

// scalePool holds the scale benchmark's addresses: 8,192, on the lab's
// segment, apart from the walkthrough's and the tests' pools.
const scalePool = "172.18.192.0/19"

// maxNodePortServices: above this many scale Services, they get no NodePorts
// (the default range 30000-32767 holds 2,768 ports, one per Service here).
// Up to it they keep them, as the walkthrough's Services do, so that figures
// for 2,000 Services stay comparable from run to run.
const maxNodePortServices = 2500

// BenchmarkFailoverScale creates E2E_SCALE_SERVICES (default 2000)
// LoadBalancer Services in front of the walkthrough's pods, from a pool of
// their own announced by every node, and reports how long that takes: until
// every create call returned, every Service has its IP, every one is
// announced (a ServiceL2Status each), and the last one created answers from
// mypc (its announcer answers ARP and its node's kube-proxy has synced), with
// the CPU time each lab process spent meanwhile (what limits it). Then it
// runs BenchmarkFailover's hard kills (E2E_FAILOVER_KILLS, default 5) among
// them: mypc probes the failover benchmark's own Service, one of the victim's
// IPs. The Services need a service CIDR bigger than the default /24 (each
// gets a ClusterIP): `make bench-failover-scale N=2000` brings the lab up with
// 10.200.0.0/16.
//
//	sudo make bench-failover-scale N=2000
func BenchmarkFailoverScale(b *testing.B) {
	e := benchEnv(b)
	if _, ok := e.Hosts.(NodeKiller); !ok {
		b.Skip("these hosts cannot kill a node (the lab can)")
	}
	lh, ok := e.Hosts.(LabHosts)
	if !ok {
		b.Skip("the CPU accounting reads the lab's processes")
	}
	n := getenvInt("E2E_SCALE_SERVICES", 2000)
	kills := getenvInt("E2E_FAILOVER_KILLS", 5)
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		applyWalkthrough(b, e)
		pool := &v1beta1.IPAddressPool{
			ObjectMeta: metav1.ObjectMeta{Name: "e2e-scale-pool", Namespace: Namespace},
			Spec:       v1beta1.IPAddressPoolSpec{Addresses: []string{scalePool}, AutoAssign: ptr(false)},
		}
		adv := &v1beta1.L2Advertisement{
			ObjectMeta: metav1.ObjectMeta{Name: "e2e-scale-adv", Namespace: Namespace},
			Spec:       v1beta1.L2AdvertisementSpec{IPAddressPools: []string{pool.Name}},
		}
		e.create(b, pool)
		e.create(b, adv)
		createScale(b, e, lh.Lab, n)
		runFailoverBench(b, e, kills, 0)
	}
}

// BenchmarkDrainScale creates E2E_SCALE_SERVICES (default 500) Services as
// BenchmarkFailoverScale does, then drains (the ironlb.io/drain annotation,
// as kubectl ironlb drain sets it) the node announcing the most of them,
// while mypc holds keep-alive connections and new connections to one of its
// IPs, and reports how long until no ServiceL2Status names the node, the
// CPU the lab's processes spent meanwhile, and what the client saw.
//
//	sudo make bench-drain N=500
func BenchmarkDrainScale(b *testing.B) {
	e := benchEnv(b)
	lh, ok := e.Hosts.(LabHosts)
	if !ok {
		b.Skip("the CPU accounting reads the lab's processes")
	}
	n := getenvInt("E2E_SCALE_SERVICES", 500)
	for i := 0; i < b.N; i++ {
		applyWalkthrough(b, e)
		e.create(b, &v1beta1.IPAddressPool{
			ObjectMeta: metav1.ObjectMeta{Name: "e2e-scale-pool", Namespace: Namespace},
			Spec:       v1beta1.IPAddressPoolSpec{Addresses: []string{scalePool}, AutoAssign: ptr(false)},
		})
		e.create(b, &v1beta1.L2Advertisement{
			ObjectMeta: metav1.ObjectMeta{Name: "e2e-scale-adv", Namespace: Namespace},
			Spec:       v1beta1.L2AdvertisementSpec{IPAddressPools: []string{"e2e-scale-pool"}},
		})
		createScale(b, e, lh.Lab, n)
		runDrainBench(b, e, lh.Lab)
	}
}

func runDrainBench(b *testing.B, e *Env, lab *labctl.Lab) {
	ctx := context.Background()
	statuses := func() (map[string]int, map[string]string) {
		byNode, nodeOf := map[string]int{}, map[string]string{}
		var l2 v1beta1.ServiceL2StatusList
		if err := e.C.List(ctx, &l2, client.InNamespace(Namespace)); err == nil {
			for _, s := range l2.Items {
				byNode[s.Status.Node]++
				nodeOf[s.Status.ServiceName] = s.Status.Node
			}
		}
		return byNode, nodeOf
	}
	byNode, nodeOf := statuses()
	victim := ""
	for n, c := range byNode {
		if victim == "" || c > byNode[victim] || (c == byNode[victim] && n < victim) {
			victim = n
		}
	}
	var probeSvc string
	for svc, n := range nodeOf {
		if n == victim && strings.HasPrefix(svc, "e2e-scale-") && (probeSvc == "" || svc < probeSvc) {
			probeSvc = svc
		}
	}
	ip := e.waitIngressIP(b, "default", probeSvc)
	tr := e.startTraffic(b, ip)
	drain := func(on bool) {
		var node corev1.Node
		if err := e.C.Get(ctx, client.ObjectKey{Name: victim}, &node); err != nil {
			b.Fatal(err)
		}
		patch := client.MergeFrom(node.DeepCopy())
		if node.Annotations == nil {
			node.Annotations = map[string]string{}
		}
		if on {
			node.Annotations[election.DrainAnnotation] = "true"
		} else {
			delete(node.Annotations, election.DrainAnnotation)
		}
		if err := e.C.Patch(ctx, &node, patch); err != nil {
			b.Fatal(err)
		}
	}
	b.Cleanup(func() { drain(false) })
	fmt.Fprintf(os.Stderr, "drain: %s announces %d Services (%v); mypc's traffic goes to %s (%s)\n", victim, byNode[victim], byNode, probeSvc, ip)
	cpuBefore := labCPU(ctx, e, lab)
	start := time.Now()
	drain(true)
	poll(b, 10*time.Minute, "no ServiceL2Status on "+victim, func() (bool, string) {
		c, _ := statuses()
		return c[victim] == 0, fmt.Sprintf("%d left on %s", c[victim], victim)
	})
	took := time.Since(start)
	cpu := cpuDelta(cpuBefore, labCPU(ctx, e, lab))
	time.Sleep(settle)
	rep := tr.stop(b)
	after, _ := statuses()
	fmt.Fprintf(os.Stderr, "drain: %d Services moved off %s in %v; now %v\n", byNode[victim], victim, took.Round(100*time.Millisecond), after)
	fmt.Fprintf(os.Stderr, "drain: CPU seconds spent by the lab's processes meanwhile:\n%s", cpu)
	fmt.Fprintf(os.Stderr, "drain: mypc's traffic to %s: %s\n", ip, rep)
	if f := rep.NewConns.Failures; len(f) > 0 {
		fmt.Fprintf(os.Stderr, "drain: the first failed new connections:\n  %s\n", strings.Join(f[:min(len(f), 5)], "\n  "))
	}
	b.ReportMetric(took.Seconds(), "drain-s")
	b.ReportMetric(float64(byNode[victim]), "ips-moved")
	b.ReportMetric(float64(rep.KeepAlive.Broken), "keepalive-broken")
	b.ReportMetric(float64(rep.NewConns.Failed), "new-failed")
}

// createScale creates n Services e2e-scale-NNNNN (deleted when the benchmark
// ends, unless the lab goes down with them) and reports the intervals and CPU use described above.
func createScale(b *testing.B, e *Env, lab *labctl.Lab, n int) {
	ctx := context.Background()
	cs := fastClient(b, e)
	names := make([]string, n)
	for i := range names {
		names[i] = fmt.Sprintf("e2e-scale-%05d", i+1)
	}
	b.Cleanup(func() {
		if e.Ephemeral {
			return // the lab goes down with everything in it
		}
		start := time.Now()
		if err := parallel(names, func(name string) error {
			err := cs.CoreV1().Services("default").Delete(context.Background(), name, metav1.DeleteOptions{})
			if apierrors.IsNotFound(err) {
				return nil
			}
			return err
		}); err != nil {
			b.Errorf("deleting the scale Services: %v", err)
		}
		fmt.Fprintf(os.Stderr, "scale: deleted %d Services in %v\n", n, time.Since(start).Round(100*time.Millisecond))
	})

	cpuBefore := labCPU(ctx, e, lab)
	start := time.Now()
	if err := parallel(names, func(name string) error {
		svc := lbService(name, "webpod", "")
		svc.Annotations["metallb.io/address-pool"] = "e2e-scale-pool"
		if n > maxNodePortServices {
			// An L2 load balancer needs no NodePorts; a cluster with
			// more LoadBalancer Services than the NodePort range holds
			// must turn their allocation off, as this does.
			svc.Spec.AllocateLoadBalancerNodePorts = ptr(false)
		}
		_, err := cs.CoreV1().Services("default").Create(ctx, svc, metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) {
			return nil // a leftover of an interrupted run
		}
		return err
	}); err != nil {
		b.Fatalf("creating %d Services: %v", n, err)
	}
	created := time.Since(start)
	fmt.Fprintf(os.Stderr, "scale: %d create calls returned after %v\n", n, created.Round(100*time.Millisecond))

	var allocated, announced time.Duration
	poll(b, 30*time.Minute, fmt.Sprintf("%d scale Services with an IP and a ServiceL2Status", n), func() (bool, string) {
		var svcs corev1.ServiceList
		if err := e.C.List(ctx, &svcs, client.InNamespace("default")); err != nil {
			return false, err.Error()
		}
		withIP := 0
		for _, s := range svcs.Items {
			if strings.HasPrefix(s.Name, "e2e-scale-") && len(s.Status.LoadBalancer.Ingress) > 0 {
				withIP++
			}
		}
		if withIP == n && allocated == 0 {
			allocated = time.Since(start)
			fmt.Fprintf(os.Stderr, "scale: every Service has its IP after %v\n", allocated.Round(100*time.Millisecond))
		}
		var l2 v1beta1.ServiceL2StatusList
		if err := e.C.List(ctx, &l2, client.InNamespace(Namespace)); err != nil {
			return false, err.Error()
		}
		owned := map[string]bool{}
		for _, s := range l2.Items {
			if strings.HasPrefix(s.Status.ServiceName, "e2e-scale-") {
				owned[s.Status.ServiceName] = true
			}
		}
		if len(owned) == n && announced == 0 {
			announced = time.Since(start)
			fmt.Fprintf(os.Stderr, "scale: every Service is announced (ServiceL2Status) after %v\n", announced.Round(100*time.Millisecond))
		}
		return allocated > 0 && announced > 0, fmt.Sprintf("%d with an IP, %d announced", withIP, len(owned))
	})
	last := e.waitIngressIP(b, "default", names[n-1])
	e.waitServing(b, last)
	serving := time.Since(start)
	cpu := cpuDelta(cpuBefore, labCPU(ctx, e, lab))
	fmt.Fprintf(os.Stderr, "scale: the last Service created (%s, %s) answers mypc after %v\n", names[n-1], last, serving.Round(100*time.Millisecond))
	fmt.Fprintf(os.Stderr, "scale: CPU seconds spent by the lab's processes meanwhile (%v wall, 2 cores = %.0f CPU s available):\n%s",
		serving.Round(time.Second), 2*serving.Seconds(), cpu)
	b.ReportMetric(created.Seconds(), "create-calls-s")
	b.ReportMetric(allocated.Seconds(), "all-ips-s")
	b.ReportMetric(announced.Seconds(), "all-announced-s")
	b.ReportMetric(serving.Seconds(), "last-serving-s")
	byNode := map[string]int{}
	var l2 v1beta1.ServiceL2StatusList
	if err := e.C.List(ctx, &l2, client.InNamespace(Namespace)); err == nil {
		for _, s := range l2.Items {
			byNode[s.Status.Node]++
		}
	}
	fmt.Fprintf(os.Stderr, "scale: ServiceL2Status per node: %v\n", byNode)
}

// fastClient is a clientset without the suite's client-side rate limit, so
// that the API server, not the client, limits the creation.
func fastClient(b *testing.B, e *Env) kubernetes.Interface {
	cfg, err := clientcmd.BuildConfigFromFlags("", e.Kubeconfig)
	if err != nil {
		b.Fatal(err)
	}
	cfg.QPS, cfg.Burst = 1000, 1000
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		b.Fatal(err)
	}
	return cs
}

// parallel runs fn for every name, 16 at a time, and returns the first error.
func parallel(names []string, fn func(string) error) error {
	var (
		wg    sync.WaitGroup
		next  atomic.Int64
		first atomic.Pointer[error]
	)
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1)) - 1
				if i >= len(names) || first.Load() != nil {
					return
				}
				if err := fn(names[i]); err != nil {
					err = fmt.Errorf("%s: %w", names[i], err)
					first.CompareAndSwap(nil, &err)
				}
			}
		}()
	}
	wg.Wait()
	if p := first.Load(); p != nil {
		return *p
	}
	return nil
}

// labCPU returns the CPU seconds (user+system) used so far by each of the
// lab's daemons and by ironlb's pods, by name.
func labCPU(ctx context.Context, e *Env, lab *labctl.Lab) map[string]float64 {
	out := map[string]float64{}
	procs, _ := lab.Procs()
	for _, p := range procs {
		if p.Alive {
			out[p.Name] = cpuSeconds(p.Pid)
		}
	}
	var pods corev1.PodList
	if err := e.C.List(ctx, &pods, client.InNamespace(Namespace)); err == nil {
		for _, p := range pods.Items {
			for _, c := range p.Status.ContainerStatuses {
				var pid int
				if _, err := fmt.Sscanf(c.ContainerID, "lab://%d", &pid); err == nil {
					out[p.Name+" ("+p.Spec.NodeName+")"] = cpuSeconds(pid)
				}
			}
		}
	}
	return out
}

// cpuSeconds reads the CPU time of pid from /proc: its own (utime, stime) and
// that of its children it has waited for (cutime, cstime: kube-proxy's
// iptables-restore runs); 0 if it is gone.
func cpuSeconds(pid int) float64 {
	st, err := procstat.Read(pid)
	if err != nil {
		return 0
	}
	return (time.Duration(st.UTime+st.STime+st.CUTime+st.CSTime) * procstat.ClockTick).Seconds()
}

// cpuDelta formats the CPU seconds spent between two labCPU readings, the
// biggest first.
func cpuDelta(before, after map[string]float64) string {
	type row struct {
		name string
		s    float64
	}
	var rows []row
	for k, v := range after {
		rows = append(rows, row{k, v - before[k]})
	}
	sort.Slice(rows, func(i, j int) bool { return rows[i].s > rows[j].s })
	var b strings.Builder
	for _, r := range rows {
		if r.s >= 0.5 {
			fmt.Fprintf(&b, "  %-45s %7.1f s\n", r.name, r.s)
		}
	}
	return b.String()
}
