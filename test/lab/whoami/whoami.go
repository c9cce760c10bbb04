// Package whoami is the lab's stand-in for the traefik/whoami image: an HTTP
// server that tells who answered (the pod's name) and what it received.
package whoami

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"sort"
	"strings"
)

// Handler answers every request with the host name, the local addresses,
// the client's address and the request line and headers; /health is 200.
func Handler(hostname string) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/health", func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusOK)
	})
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		var b strings.Builder
		fmt.Fprintf(&b, "Hostname: %s\n", hostname)
		for _, ip := range localIPs() {
			fmt.Fprintf(&b, "IP: %s\n", ip)
		}
		fmt.Fprintf(&b, "RemoteAddr: %s\n", r.RemoteAddr)
		fmt.Fprintf(&b, "%s %s %s\n", r.Method, r.URL.RequestURI(), r.Proto)
		fmt.Fprintf(&b, "Host: %s\n", r.Host)
		keys := make([]string, 0, len(r.Header))
		for k := range r.Header {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			for _, v := range r.Header[k] {
				fmt.Fprintf(&b, "%s: %s\n", k, v)
			}
		}
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = io.WriteString(w, b.String()) // fails only when the client has gone
	})
	return mux
}

// Hostname is $HOSTNAME (the pod name, set by the lab agent) or the OS host name.
func Hostname() string {
	if h := os.Getenv("HOSTNAME"); h != "" {
		return h
	}
	h, _ := os.Hostname()
	return h
}

func localIPs() []string {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return nil
	}
	var out []string
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok {
			out = append(out, n.IP.String())
		}
	}
	return out
}
