package speaker

import (
	"fmt"
	"net"
	"net/http"
	"time"

	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/manager"

	"github.com/ironlb/ironlb/internal/statusview"
)

// probeServer is the speaker's health server: /healthz (live: its
// ownership loop makes progress) and /readyz as the manager's own health
// probe server serves them (the kubelet probes them), plus statusview.Path.
// The speaker runs it instead of the manager's, which serves nothing but the
// probes.
func probeServer(addr string, live, ready healthz.Checker, status http.Handler) (*manager.Server, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("health probe address %s: %w", addr, err)
	}
	mux := http.NewServeMux()
	for path, h := range map[string]http.Handler{
		"/healthz": &healthz.Handler{Checks: map[string]healthz.Checker{"ownership-loop": live}},
		"/readyz":  &healthz.Handler{Checks: map[string]healthz.Checker{"can-announce": ready}},
	} {
		mux.Handle(path, http.StripPrefix(path, h))
		mux.Handle(path+"/", http.StripPrefix(path, h)) // /readyz/can-announce
	}
	mux.Handle(statusview.Path, status)
	return &manager.Server{
		Name:            "health probe",
		Server:          &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second},
		Listener:        ln,
		ShutdownTimeout: ptr.To(time.Second),
	}, nil
}
