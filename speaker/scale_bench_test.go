package speaker

import (
	"fmt"
	"math/rand"
	"runtime"
	"syscall"
	"testing"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/ironlb/ironlb/api/v1beta1"
	"github.com/ironlb/ironlb/internal/config"
	"github.com/ironlb/ironlb/internal/ownership"
)

// scaleInputs is a synthetic cluster as the speaker's cache holds it: Nodes
// with the labels, addresses and conditions a real one has, LoadBalancer
// Services with their ingress IP, one EndpointSlice each with three ready
// endpoints on random nodes, two pools and two L2Advertisements (one for
// every node, one for the nodes of zone a).
type scaleInputs struct {
	snap   Snapshot
	nodes  []string
	svcs   []*corev1.Service
	slices [][]*discoveryv1.EndpointSlice
}

// localEvery: every localEvery-th Service has externalTrafficPolicy Local
// (its eligible nodes are its endpoints' nodes: a node set of its own).
const localEvery = 10

func newScaleInputs(tb testing.TB, nNodes, nServices int, rnd *rand.Rand) *scaleInputs {
	tb.Helper()
	cfg, err := config.Parse(
		[]v1beta1.IPAddressPool{pool("default", "10.100.0.0/17"), pool("zonal", "10.100.128.0/17")},
		[]v1beta1.L2Advertisement{
			l2ad("all", []string{"default"}, nil, nil),
			l2ad("zone-a", []string{"zonal"}, nil, map[string]string{"topology.kubernetes.io/zone": "a"}),
		}, nil)
	if err != nil {
		tb.Fatal(err)
	}
	in := &scaleInputs{snap: Snapshot{Config: cfg, Nodes: map[string]*corev1.Node{}}}
	for i := range nNodes {
		name := fmt.Sprintf("node-%04d", i)
		in.nodes = append(in.nodes, name)
		in.snap.Nodes[name] = &corev1.Node{
			ObjectMeta: metav1.ObjectMeta{Name: name, UID: types.UID("uid-" + name), ResourceVersion: "12345", Labels: map[string]string{
				"kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64",
				"topology.kubernetes.io/zone": string(rune('a' + i%3)), "node.kubernetes.io/instance-type": "metal",
			}},
			Spec: corev1.NodeSpec{PodCIDR: fmt.Sprintf("10.244.%d.0/24", i%256)},
			Status: corev1.NodeStatus{
				Addresses: []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: fmt.Sprintf("192.168.%d.%d", i/250, 1+i%250)},
					{Type: corev1.NodeHostName, Address: name}},
				Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue},
					{Type: corev1.NodeNetworkUnavailable, Status: corev1.ConditionFalse}},
			},
		}
	}
	in.snap.Self = in.nodes[0]
	for i := range nServices {
		// Services alternate between the pools: 10.100.x.y (default) and
		// 10.100.128+x.y (zonal).
		ip := fmt.Sprintf("10.100.%d.%d", (i%2)*128+(i/2)/250, 1+(i/2)%250)
		svc := lbService(ip)
		svc.Namespace, svc.Name = fmt.Sprintf("ns-%03d", i%100), fmt.Sprintf("svc-%05d", i)
		svc.UID = types.UID(fmt.Sprintf("uid-svc-%05d", i))
		svc.ResourceVersion = "1"
		if i%localEvery == 0 {
			svc.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
		}
		in.svcs = append(in.svcs, svc)
		in.slices = append(in.slices, []*discoveryv1.EndpointSlice{in.slice(svc, rnd)})
	}
	return in
}

// slice is an EndpointSlice of svc with three ready endpoints on random nodes.
func (in *scaleInputs) slice(svc *corev1.Service, rnd *rand.Rand) *discoveryv1.EndpointSlice {
	ready := true
	s := &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: svc.Namespace, Name: svc.Name + "-abcde",
		Labels: map[string]string{discoveryv1.LabelServiceName: svc.Name}}}
	for j := range 3 {
		node := in.nodes[rnd.Intn(len(in.nodes))]
		s.Endpoints = append(s.Endpoints, discoveryv1.Endpoint{Addresses: []string{fmt.Sprintf("10.244.%d.%d", j, rnd.Intn(250))},
			NodeName: &node, Conditions: discoveryv1.EndpointConditions{Ready: &ready}})
	}
	return s
}

func (in *scaleInputs) key(i int) string { return in.svcs[i].Namespace + "/" + in.svcs[i].Name }

// BenchmarkSpeakerAtScale is issue 10's speaker figure: memory and CPU of
// one speaker's state at 10,000 LoadBalancer Services and 1,000 Nodes. It
// builds the objects the speaker's cache would hold, then feeds every
// Service through the reconcile path after its cache reads (Inputs, then
// owners.SetService into the ownership engine and the announcer) and starts
// deciding (owners.Sync), with every node's speaker alive. Then, with all
// IPs placed:
//
//   - Service updates: a Service's endpoints move (one in ten Services has
//     externalTrafficPolicy Local, so its eligible nodes change), Inputs and
//     SetService again;
//   - membership events: a node dies as a speaker sees it (speaker gone,
//     then its data path down: its IPs move) and returns, 3 events.
//
// The announcer is the tests' recording one (a map per Service), as in the
// other owners tests. Heap is measured after GC: the synthetic cache objects
// alone, and what the speaker's state adds.
//
//	go test ./speaker -run '^$' -bench BenchmarkSpeakerAtScale -benchtime 1x -benchmem
func BenchmarkSpeakerAtScale(b *testing.B) {
	const nNodes, nServices, updates, deaths = 1000, 10000, 2000, 20
	rnd := rand.New(rand.NewSource(1))
	base := heapLive()
	in := newScaleInputs(b, nNodes, nServices, rnd)
	cacheHeap := heapLive() - base
	b.ResetTimer()
	for range b.N {
		now := time.Now()
		own := newOwners(logr.Discard(), in.snap.Self, ownership.Options{Hold: 30 * time.Second}, newFakeAnnouncer(), newMetrics(nil), nopRecorder{})
		for _, n := range in.nodes {
			own.SetSpeaker(n, ownership.SpeakerAlive, now)
		}
		before := heapLive()
		cpu := cpuTime()
		for i, svc := range in.svcs {
			own.SetService(in.key(i), Inputs(in.snap, svc, in.slices[i]), svc)
		}
		own.Sync(now, nil)
		ingest := cpuTime() - cpu
		speakerHeap := heapLive() - before
		if placed := len(own.eng.Claims()); placed != nServices {
			b.Fatalf("%d of %d Services' IPs placed after Sync; unplaced: %v", placed, nServices, own.eng.Unplaced())
		}

		cpu = cpuTime()
		for range updates {
			i := rnd.Intn(nServices)
			in.slices[i] = []*discoveryv1.EndpointSlice{in.slice(in.svcs[i], rnd)}
			own.SetService(in.key(i), Inputs(in.snap, in.svcs[i], in.slices[i]), in.svcs[i])
		}
		update := (cpuTime() - cpu) / updates

		moved := 0
		cpu = cpuTime()
		for range deaths {
			victim := in.nodes[1+rnd.Intn(nNodes-1)]
			now = now.Add(time.Second)
			owned := own.eng.Load(victim)
			own.SetSpeaker(victim, ownership.SpeakerGone, now)
			watchersVote(own, victim, ownership.PathDown, "", nil)
			if after := own.eng.Load(victim); after != 0 {
				b.Fatalf("%s still owns %d keys after its data path went down", victim, after)
			}
			moved += owned
			own.SetSpeaker(victim, ownership.SpeakerAlive, now)
		}
		event := (cpuTime() - cpu) / (3 * deaths)

		ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
		b.ReportMetric(float64(cacheHeap)/(1<<20), "cache-heap-MiB")
		b.ReportMetric(float64(speakerHeap)/(1<<20), "speaker-heap-MiB")
		b.ReportMetric(float64(speakerHeap)/nServices, "speaker-bytes/service")
		b.ReportMetric(ms(ingest), "ingest-cpu-ms")
		b.ReportMetric(float64(ingest.Microseconds())/nServices, "ingest-cpu-us/service")
		b.ReportMetric(float64(update.Microseconds()), "update-cpu-us")
		b.ReportMetric(ms(event), "event-cpu-ms")
		b.ReportMetric(float64(moved)/deaths, "ips-moved/death")
		b.Logf("%d nodes, %d Services (%d node sets interned): cache objects %d MiB, speaker state %d MiB (%d bytes per Service); ingest %v CPU; update %v CPU; membership event %v CPU, %.1f IPs moved per death",
			nNodes, nServices, own.sets.Len(), cacheHeap>>20, speakerHeap>>20, speakerHeap/nServices, ingest.Round(time.Millisecond), update, event, float64(moved)/deaths)
		runtime.KeepAlive(own)
	}
	runtime.KeepAlive(in)
}

// heapLive is the heap in use by live objects, after a full collection.
func heapLive() int64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return int64(m.HeapAlloc)
}

// cpuTime is the CPU this process used so far (user and system, every
// thread: the garbage collector's work included).
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
