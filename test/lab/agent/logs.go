package agent

import (
	"bufio"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"io"
	"math"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"runtime"
)

func (a *Agent) containerLogPath(namespace, pod, container string) string {
	return filepath.Join(a.cfg.LogDir, namespace+"_"+pod+"_"+container+".log")
}

func (a *Agent) nodeAllocatable() corev1.ResourceList {
	return corev1.ResourceList{
		corev1.ResourceCPU:    *resource.NewQuantity(int64(runtime.NumCPU()), resource.DecimalSI),
		corev1.ResourceMemory: *resource.NewQuantity(memTotal(), resource.BinarySI),
	}
}

// serveKubelet serves the part of the kubelet API the API server uses for
// `kubectl logs` (GET /containerLogs/{namespace}/{pod}/{container} with
// follow, tailLines, limitBytes and previous) and `kubectl exec`
// (/exec/{namespace}/{pod}/{container}), over HTTPS with a self-signed certificate
// (the API server does not verify kubelet certificates unless it is given
// --kubelet-certificate-authority).
func (a *Agent) serveKubelet(ctx context.Context) error {
	cert, err := selfSignedCert(a.cfg.NodeName, a.cfg.NodeIP)
	if err != nil {
		return err
	}
	mux := a.kubeletMux()
	srv := &http.Server{
		Addr:    net.JoinHostPort("", strconv.Itoa(a.cfg.KubeletPort)),
		Handler: mux,
		// HTTP/1.1 only: exec upgrades the connection to SPDY, which HTTP/2 cannot.
		TLSConfig:         &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12, NextProtos: []string{"http/1.1"}},
		ReadHeaderTimeout: 10 * time.Second,
		BaseContext:       func(net.Listener) context.Context { return ctx },
	}
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		if err := srv.Shutdown(sctx); err != nil {
			a.log.Error(err, "Kubelet endpoint did not shut down cleanly")
		}
	}()
	if err := srv.ListenAndServeTLS("", ""); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("serving the kubelet endpoint on port %d: %w", a.cfg.KubeletPort, err)
	}
	return nil
}

func (a *Agent) kubeletMux() *http.ServeMux {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok") })
	mux.HandleFunc("GET /containerLogs/{namespace}/{pod}/{container}", a.handleContainerLogs)
	mux.HandleFunc("/exec/{namespace}/{pod}/{container}", a.handleExec)
	return mux
}

func (a *Agent) handleContainerLogs(w http.ResponseWriter, r *http.Request) {
	ns, pod, container := r.PathValue("namespace"), r.PathValue("pod"), r.PathValue("container")
	q := r.URL.Query()
	path := a.containerLogPath(ns, pod, container)
	f, err := os.Open(path)
	if err != nil {
		http.Error(w, fmt.Sprintf("no logs for container %q in pod %s/%s on node %s", container, ns, pod, a.cfg.NodeName), http.StatusNotFound)
		return
	}
	defer func() { _ = f.Close() }()
	// The file holds every run of the container; serve the current run (or
	// the previous one) when this agent knows where they start.
	start, end := int64(0), int64(-1)
	if wk := a.workerByName(ns, pod); wk != nil {
		if cr := wk.runner(container); cr != nil {
			var ok bool
			if start, end, ok = cr.logRange(q.Get("previous") == "true"); !ok {
				http.Error(w, fmt.Sprintf("previous terminated container %q in pod %q not found", container, pod), http.StatusBadRequest)
				return
			}
		}
	}
	size := math.MaxInt64 - start
	if end >= 0 {
		size = end - start
	}
	sec := io.NewSectionReader(f, start, size)
	if s := q.Get("tailLines"); s != "" {
		if n, err := strconv.Atoi(s); err == nil && n >= 0 {
			if off, err := tailOffset(sec, n); err == nil {
				sec = io.NewSectionReader(f, start+off, size-off)
			} else {
				_, _ = sec.Seek(0, io.SeekStart) // serve it all; cannot fail for offset 0
			}
		}
	}
	w.Header().Set("Content-Type", "text/plain")
	var out io.Writer = w
	if s := q.Get("limitBytes"); s != "" {
		if n, err := strconv.ParseInt(s, 10, 64); err == nil && n > 0 {
			out = &limitWriter{w: w, n: n}
		}
	}
	if _, err := io.Copy(out, sec); err != nil {
		return
	}
	if q.Get("follow") != "true" || end >= 0 {
		return
	}
	flusher, _ := w.(http.Flusher)
	for {
		if flusher != nil {
			flusher.Flush()
		}
		select {
		case <-r.Context().Done():
			return
		case <-time.After(250 * time.Millisecond):
		}
		if _, err := io.Copy(out, sec); err != nil {
			return
		}
		if a.workerByName(ns, pod) == nil {
			return
		}
	}
}

type limitWriter struct {
	w io.Writer
	n int64
}

func (l *limitWriter) Write(p []byte) (int, error) {
	if l.n <= 0 {
		return 0, io.EOF
	}
	if int64(len(p)) > l.n {
		p = p[:l.n]
	}
	n, err := l.w.Write(p)
	l.n -= int64(n)
	return n, err
}

// tailOffset returns the offset in r of its last n lines.
func tailOffset(r io.Reader, n int) (int64, error) {
	var offsets []int64
	var pos int64
	br := bufio.NewReader(r)
	for {
		line, err := br.ReadBytes('\n')
		if len(line) > 0 {
			offsets = append(offsets, pos)
			pos += int64(len(line))
		}
		if err == io.EOF {
			break
		}
		if err != nil {
			return 0, err
		}
	}
	if n >= len(offsets) {
		return 0, nil
	}
	return offsets[len(offsets)-n], nil
}

func selfSignedCert(nodeName, nodeIP string) (tls.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("generating the kubelet serving key: %w", err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()),
		Subject:      pkix.Name{CommonName: nodeName},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(365 * 24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		DNSNames:     []string{nodeName},
	}
	if ip := net.ParseIP(nodeIP); ip != nil {
		tmpl.IPAddresses = []net.IP{ip}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("creating the kubelet serving certificate: %w", err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, nil
}
