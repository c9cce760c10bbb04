package agent

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

func TestProbeCounter(t *testing.T) {
	p := &corev1.Probe{SuccessThreshold: 2, FailureThreshold: 3}
	c := NewProbeCounter(p, false)
	steps := []struct {
		ok              bool
		result, crossed bool
	}{
		{true, false, false},
		{true, true, true}, // 2 successes: ready
		{false, true, false},
		{false, true, false},
		{true, true, false}, // failures reset
		{false, true, false},
		{false, true, false},
		{false, false, true}, // 3 failures: not ready
		{false, false, false},
		{true, false, false},
		{true, true, true},
	}
	for i, s := range steps {
		r, x := c.Record(s.ok)
		if r != s.result || x != s.crossed {
			t.Fatalf("step %d (ok=%v): got result=%v crossed=%v, want %v %v", i, s.ok, r, x, s.result, s.crossed)
		}
	}
	// A liveness probe starts true and crosses once at the failure threshold.
	l := NewProbeCounter(&corev1.Probe{}, true)
	for i := 1; i <= 4; i++ {
		_, x := l.Record(false)
		if x != (i == 3) {
			t.Errorf("liveness failure %d: crossed=%v", i, x)
		}
	}
}

func TestRunProbe(t *testing.T) {
	var mu sync.Mutex
	healthy := true
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		if r.URL.Path != "/metrics" || r.Header.Get("X-Probe") != "yes" || r.Host != "example" {
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		if !healthy {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
	}))
	defer srv.Close()
	u, _ := url.Parse(srv.URL)
	host, portS, _ := net.SplitHostPort(u.Host)
	port, _ := strconv.Atoi(portS)
	target := ProbeTarget{Host: host, Ports: []corev1.ContainerPort{{Name: "monitoring", ContainerPort: int32(port)}}}
	httpProbe := &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{
		Path: "/metrics", Port: intstr.FromString("monitoring"),
		HTTPHeaders: []corev1.HTTPHeader{{Name: "X-Probe", Value: "yes"}, {Name: "Host", Value: "example"}},
	}}}
	ctx := context.Background()
	if err := RunProbe(ctx, httpProbe, target); err != nil {
		t.Errorf("healthy http probe: %v", err)
	}
	mu.Lock()
	healthy = false
	mu.Unlock()
	if err := RunProbe(ctx, httpProbe, target); err == nil {
		t.Error("http probe on 503: want failure")
	}
	tcp := &corev1.Probe{ProbeHandler: corev1.ProbeHandler{TCPSocket: &corev1.TCPSocketAction{Port: intstr.FromInt32(int32(port))}}}
	if err := RunProbe(ctx, tcp, target); err != nil {
		t.Errorf("tcp probe on a listening port: %v", err)
	}
	srv.Close()
	if err := RunProbe(ctx, tcp, target); err == nil {
		t.Error("tcp probe on a closed port: want failure")
	}
	bad := &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Port: intstr.FromString("nope")}}}
	if err := RunProbe(ctx, bad, target); err == nil {
		t.Error("unknown named port: want an error")
	}
	execOK := ProbeTarget{Exec: func(context.Context, []string) error { return nil }}
	execFail := ProbeTarget{Exec: func(context.Context, []string) error { return errors.New("exit status 1") }}
	ep := &corev1.Probe{ProbeHandler: corev1.ProbeHandler{Exec: &corev1.ExecAction{Command: []string{"true"}}}}
	if RunProbe(ctx, ep, execOK) != nil || RunProbe(ctx, ep, execFail) == nil {
		t.Error("exec probe results wrong")
	}
}

// TestProbeLoop checks that a readiness probe turns ready after the server
// comes up and unready when it fails, through the real loop and thresholds.
func TestProbeLoop(t *testing.T) {
	var mu sync.Mutex
	code := http.StatusServiceUnavailable
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		w.WriteHeader(code)
	}))
	defer srv.Close()
	u, _ := url.Parse(srv.URL)
	host, portS, _ := net.SplitHostPort(u.Host)
	port, _ := strconv.Atoi(portS)
	p := &corev1.Probe{PeriodSeconds: 1, FailureThreshold: 1, ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Port: intstr.FromInt32(int32(port))}}}
	results := make(chan bool, 100)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go probeLoop(ctx, p, ProbeTarget{Host: host}, false, func(ok, _ bool, _ error) { results <- ok })
	waitFor := func(want bool) {
		t.Helper()
		deadline := time.After(20 * time.Second)
		for {
			select {
			case r := <-results:
				if r == want {
					return
				}
			case <-deadline:
				t.Fatalf("probe result never became %v", want)
			}
		}
	}
	waitFor(false)
	mu.Lock()
	code = http.StatusOK
	mu.Unlock()
	waitFor(true)
	mu.Lock()
	code = http.StatusInternalServerError
	mu.Unlock()
	waitFor(false)
}
