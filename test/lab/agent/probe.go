package agent

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// ProbeTarget is what a probe checks: the pod's address, the container's
// ports (for named ports) and a way to run a command inside the container.
type ProbeTarget struct {
	Host  string
	Ports []corev1.ContainerPort
	Exec  func(ctx context.Context, cmd []string) error
}

// RunProbe performs one check of p against t and returns nil on success.
// The caller bounds ctx by the probe's timeout.
func RunProbe(ctx context.Context, p *corev1.Probe, t ProbeTarget) error {
	switch {
	case p.HTTPGet != nil:
		return probeHTTP(ctx, p.HTTPGet, t)
	case p.TCPSocket != nil:
		port, err := resolvePort(p.TCPSocket.Port, t.Ports)
		if err != nil {
			return err
		}
		host := p.TCPSocket.Host
		if host == "" {
			host = t.Host
		}
		var d net.Dialer
		conn, err := d.DialContext(ctx, "tcp", net.JoinHostPort(host, strconv.Itoa(port)))
		if err != nil {
			return fmt.Errorf("tcp probe: %w", err)
		}
		_ = conn.Close() // connecting was the check
		return nil
	case p.Exec != nil:
		if t.Exec == nil {
			return fmt.Errorf("exec probe: no way to run commands in this container")
		}
		if err := t.Exec(ctx, p.Exec.Command); err != nil {
			return fmt.Errorf("exec probe %q: %w", strings.Join(p.Exec.Command, " "), err)
		}
		return nil
	case p.GRPC != nil:
		// The lab has no gRPC health client; a TCP connect is the closest honest check.
		var d net.Dialer
		conn, err := d.DialContext(ctx, "tcp", net.JoinHostPort(t.Host, strconv.Itoa(int(p.GRPC.Port))))
		if err != nil {
			return fmt.Errorf("grpc probe (TCP connect only): %w", err)
		}
		_ = conn.Close() // connecting was the check
		return nil
	}
	return fmt.Errorf("probe has no handler")
}

var probeTransport = &http.Transport{
	TLSClientConfig:   &tls.Config{InsecureSkipVerify: true}, // the kubelet does not verify probe certificates either
	DisableKeepAlives: true,
	Proxy:             nil,
}

func probeHTTP(ctx context.Context, g *corev1.HTTPGetAction, t ProbeTarget) error {
	port, err := resolvePort(g.Port, t.Ports)
	if err != nil {
		return err
	}
	host := g.Host
	if host == "" {
		host = t.Host
	}
	scheme := strings.ToLower(string(g.Scheme))
	if scheme == "" {
		scheme = "http"
	}
	path := g.Path
	if !strings.HasPrefix(path, "/") {
		path = "/" + path
	}
	u := url.URL{Scheme: scheme, Host: net.JoinHostPort(host, strconv.Itoa(port))}
	full := u.String() + path
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, full, nil)
	if err != nil {
		return fmt.Errorf("http probe %s: %w", full, err)
	}
	req.Header.Set("User-Agent", "kube-probe/1.37")
	for _, h := range g.HTTPHeaders {
		if strings.EqualFold(h.Name, "Host") {
			req.Host = h.Value
			continue
		}
		req.Header.Add(h.Name, h.Value)
	}
	client := &http.Client{Transport: probeTransport, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := client.Do(req)
	if err != nil {
		return fmt.Errorf("http probe: %w", err)
	}
	defer func() { _ = resp.Body.Close() }()
	// Drained so the connection can be reused; the status code is the check.
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 10<<10))
	if resp.StatusCode < 200 || resp.StatusCode >= 400 {
		return fmt.Errorf("http probe %s: status %d", full, resp.StatusCode)
	}
	return nil
}

func resolvePort(p intstr.IntOrString, ports []corev1.ContainerPort) (int, error) {
	if p.Type == intstr.Int {
		if p.IntVal <= 0 || p.IntVal > 65535 {
			return 0, fmt.Errorf("probe port %d out of range", p.IntVal)
		}
		return int(p.IntVal), nil
	}
	for _, cp := range ports {
		if cp.Name == p.StrVal {
			return int(cp.ContainerPort), nil
		}
	}
	if n, err := strconv.Atoi(p.StrVal); err == nil {
		return n, nil
	}
	return 0, fmt.Errorf("probe port %q: no container port of that name", p.StrVal)
}

// ProbeCounter turns a stream of check results into a probe result using
// successThreshold and failureThreshold, as the kubelet's prober does.
type ProbeCounter struct {
	successThreshold, failureThreshold int32
	successes, failures                int32
	result                             bool
}

// NewProbeCounter starts at initial (false for readiness and startup probes,
// true for liveness probes).
func NewProbeCounter(p *corev1.Probe, initial bool) *ProbeCounter {
	st, ft := p.SuccessThreshold, p.FailureThreshold
	if st <= 0 {
		st = 1
	}
	if ft <= 0 {
		ft = 3
	}
	return &ProbeCounter{successThreshold: st, failureThreshold: ft, result: initial}
}

// Record adds one check result. It returns the probe's result and whether
// this check crossed a threshold: the result turned true after
// successThreshold successes, or failureThreshold consecutive failures were
// just reached (the moment a liveness or startup probe kills the container).
func (c *ProbeCounter) Record(ok bool) (result, crossed bool) {
	if ok {
		c.failures = 0
		c.successes++
		if !c.result && c.successes >= c.successThreshold {
			c.result = true
			return true, true
		}
		return c.result, false
	}
	c.successes = 0
	c.failures++
	if c.failures == c.failureThreshold {
		c.result = false
		return false, true
	}
	return c.result, false
}

// Result is the current probe result.
func (c *ProbeCounter) Result() bool { return c.result }

// probeLoop checks p every period after the initial delay and calls onResult
// with each probe result (after thresholds), until ctx ends.
func probeLoop(ctx context.Context, p *corev1.Probe, t ProbeTarget, initial bool, onResult func(ok bool, crossed bool, err error)) {
	counter := NewProbeCounter(p, initial)
	period := time.Duration(p.PeriodSeconds) * time.Second
	if period <= 0 {
		period = 10 * time.Second
	}
	timeout := time.Duration(p.TimeoutSeconds) * time.Second
	if timeout <= 0 {
		timeout = time.Second
	}
	if d := time.Duration(p.InitialDelaySeconds) * time.Second; d > 0 {
		select {
		case <-ctx.Done():
			return
		case <-time.After(d):
		}
	}
	tick := time.NewTicker(period)
	defer tick.Stop()
	for {
		cctx, cancel := context.WithTimeout(ctx, timeout)
		err := RunProbe(cctx, p, t)
		cancel()
		if ctx.Err() != nil {
			return
		}
		res, crossed := counter.Record(err == nil)
		onResult(res, crossed, err)
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}
