package allocator

import (
	"fmt"
	"net/netip"
	"runtime"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ironlb/ironlb/internal/config"
)

// cpuClock measures the process's CPU time (user+sys, all threads, so GC is
// included) over the timed parts of a benchmark. On this shared 2-core
// machine wall-clock ns/op depends on everyone else's load; cpu-ns/op
// measures what the allocator itself costs.
type cpuClock struct {
	start, total time.Duration
}

func cpuNow() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func (c *cpuClock) Start() { c.start = cpuNow() }
func (c *cpuClock) Stop()  { c.total += cpuNow() - c.start }

// pause stops both the benchmark timer and the CPU clock.
func (c *cpuClock) pause(b *testing.B)  { b.StopTimer(); c.Stop() }
func (c *cpuClock) resume(b *testing.B) { c.Start(); b.StartTimer() }

func (c *cpuClock) report(b *testing.B) {
	c.Stop()
	if b.N > 0 {
		b.ReportMetric(float64(c.total.Nanoseconds())/float64(b.N), "cpu-ns/op")
	}
}

func benchKeys(prefix string, n int) []string {
	keys := make([]string, n)
	for i := range keys {
		keys[i] = fmt.Sprintf("bench/%s-%d", prefix, i)
	}
	return keys
}

// fillPool allocates keys in order and fails the benchmark on error.
func fillPool(b *testing.B, a *Allocator, keys []string, req Request) {
	b.Helper()
	for _, k := range keys {
		if _, _, err := a.Allocate(k, req); err != nil {
			b.Fatalf("fill %s: %v", k, err)
		}
	}
}

// scatter returns n distinct indexes of [0, total) spread pseudo-randomly
// (a fixed LCG, so every run frees the same holes).
func scatter(seed uint64, n, total int) []int {
	seen := map[int]bool{}
	out := make([]int, 0, n)
	x := seed
	for len(out) < n {
		x = x*6364136223846793005 + 1442695040888963407
		i := int((x >> 33) % uint64(total))
		if !seen[i] {
			seen[i] = true
			out = append(out, i)
		}
	}
	return out
}

// A /16 (10.0.0.1-10.0.255.254, 65,534 addresses) with 65,000 in use and
// the 534 free addresses scattered through it: each Allocate must find the
// lowest hole.
func BenchmarkSlash16NearlyFull(b *testing.B) {
	const total, free = 65534, 534
	setup := func(b *testing.B) (*Allocator, []string) {
		a := New(pools(mkPool(b, "p", []string{"10.0.0.1-10.0.255.254"})))
		keys := benchKeys("s16", total)
		fillPool(b, a, keys, Request{})
		return a, keys
	}
	b.Run("Allocate", func(b *testing.B) {
		a, keys := setup(b)
		round := uint64(0)
		var holes []int
		refill := func() {
			round++
			holes = scatter(round, free, total)
			for _, i := range holes {
				a.Release(keys[i])
			}
		}
		refill()
		next := 0
		var cpu cpuClock
		b.ReportAllocs()
		cpu.Start()
		for b.Loop() {
			if next == len(holes) {
				cpu.pause(b)
				refill()
				next = 0
				cpu.resume(b)
			}
			if _, _, err := a.Allocate(keys[holes[next]], Request{}); err != nil {
				b.Fatal(err)
			}
			next++
		}
		cpu.report(b)
	})
	b.Run("Release", func(b *testing.B) {
		a, keys := setup(b)
		round := uint64(0)
		var victims []int
		pick := func() {
			round++
			victims = scatter(round, free, total)
		}
		pick()
		next := 0
		var cpu cpuClock
		b.ReportAllocs()
		cpu.Start()
		for b.Loop() {
			if next == len(victims) {
				cpu.pause(b)
				for _, i := range victims {
					if _, _, err := a.Allocate(keys[i], Request{}); err != nil {
						b.Fatal(err)
					}
				}
				pick()
				next = 0
				cpu.resume(b)
			}
			a.Release(keys[victims[next]])
			next++
		}
		cpu.report(b)
	})
}

// Allocate in huge pools with 1,000 and 100,000 addresses in use: the cost
// must grow with log(addresses in use), never with the pool's size.
func BenchmarkAllocateHugePool(b *testing.B) {
	for _, c := range []struct {
		name, cidr string
		req        Request
	}{
		{"Slash8", "10.0.0.0/8", Request{}},
		{"Slash64", "fd00::/64", Request{Families: v6}},
	} {
		for _, inUse := range []int{1_000, 100_000} {
			b.Run(fmt.Sprintf("%s/inUse=%d", c.name, inUse), func(b *testing.B) {
				const batch = 500
				a := New(pools(mkPool(b, "p", []string{c.cidr})))
				fillPool(b, a, benchKeys("fill", inUse), c.req)
				keys := benchKeys("new", batch)
				// Scatter holes below the fill line so the search has work to do.
				for _, i := range scatter(7, batch, inUse) {
					a.Release(fmt.Sprintf("bench/fill-%d", i))
				}
				next := 0
				var cpu cpuClock
				b.ReportAllocs()
				cpu.Start()
				for b.Loop() {
					if next == batch {
						cpu.pause(b)
						for _, k := range keys {
							a.Release(k)
						}
						next = 0
						cpu.resume(b)
					}
					if _, _, err := a.Allocate(keys[next], c.req); err != nil {
						b.Fatal(err)
					}
					next++
				}
				cpu.report(b)
			})
		}
	}
}

// BenchmarkMemoryPerIP reports the live heap per allocated address
// (runtime.MemStats after GC), keys excluded (they belong to the caller).
func BenchmarkMemoryPerIP(b *testing.B) {
	for _, c := range []struct {
		name, cidr string
		req        Request
	}{
		{"IPv4-Slash8", "10.0.0.0/8", Request{Namespace: "bench", Ports: tcp(80)}},
		{"IPv6-Slash64", "fd00::/64", Request{Namespace: "bench", Families: v6, Ports: tcp(80)}},
	} {
		b.Run(c.name, func(b *testing.B) {
			const n = 100_000
			keys := benchKeys("mem", n)
			var perIP float64
			b.ReportAllocs()
			for b.Loop() {
				before := heapInUse()
				a := New(pools(mkPool(b, "p", []string{c.cidr})))
				fillPool(b, a, keys, c.req)
				after := heapInUse()
				runtime.KeepAlive(a)
				perIP = float64(int64(after)-int64(before)) / n
			}
			b.ReportMetric(perIP, "heap-B/IP")
		})
	}
}

func BenchmarkParseService(b *testing.B) {
	s := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "web", Annotations: map[string]string{
			AnnotationLoadBalancerIPs: "10.0.0.5,fd00::5", AnnotationAllowSharedIP: "k",
		}},
		Spec: corev1.ServiceSpec{
			IPFamilies: v4v6, IPFamilyPolicy: &requir,
			Ports: []corev1.ServicePort{{Port: 80}, {Port: 443}},
		},
	}
	var cpu cpuClock
	b.ReportAllocs()
	cpu.Start()
	for b.Loop() {
		if _, _, err := ParseService(s); err != nil {
			b.Fatal(err)
		}
	}
	cpu.report(b)
}

// BenchmarkRestore10k is the controller's start-up: a fresh allocator and
// 10,000 Assign calls replaying Service status (one op = all 10,000).
func BenchmarkRestore10k(b *testing.B) {
	const n = 10_000
	keys := benchKeys("restore", n)
	ips := make([][]netip.Addr, n)
	base := netip.MustParseAddr("10.0.0.1")
	for i := range ips {
		ips[i] = []netip.Addr{base}
		base = base.Next()
	}
	p := pools(mkPool(b, "p", []string{"10.0.0.0/16"}))
	var cpu cpuClock
	b.ReportAllocs()
	cpu.Start()
	for b.Loop() {
		a := New(p)
		for i, k := range keys {
			if _, err := a.Assign(k, Request{Namespace: "bench", Ports: tcp(80)}, ips[i]); err != nil {
				b.Fatal(err)
			}
		}
	}
	cpu.report(b)
}

// BenchmarkSetPools100k re-evaluates 100,000 holders after a pool edit (one
// op = one SetPools call; nothing is lost).
func BenchmarkSetPools100k(b *testing.B) {
	const n = 100_000
	a := New(pools(mkPool(b, "p", []string{"10.0.0.0/8"})))
	fillPool(b, a, benchKeys("sp", n), Request{})
	edits := []map[string]*config.Pool{
		pools(mkPool(b, "p", []string{"10.0.0.0/8"}, avoidBuggy)),
		pools(mkPool(b, "p", []string{"10.0.0.0/8"})),
	}
	var cpu cpuClock
	i := 0
	b.ReportAllocs()
	cpu.Start()
	for b.Loop() {
		lost := a.SetPools(edits[i%2])
		i++
		if len(lost) > 0 && i > 1 {
			b.Fatalf("lost %d keys", len(lost))
		}
	}
	cpu.report(b)
}
