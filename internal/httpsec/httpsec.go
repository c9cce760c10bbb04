// Package httpsec holds the TLS settings shared by ironlb's HTTPS servers (the
// validating webhooks and the metrics endpoints).
package httpsec

import "crypto/tls"

// TLSOpts returns the options for controller-runtime's webhook and metrics servers.
// Unless enableHTTP2, the servers offer only HTTP/1.1 in ALPN: HTTP/2 exposed them
// to the stream-reset floods of CVE-2023-44487 (rapid reset) and CVE-2023-39325,
// and neither server gains anything from it (one short request per connection
// from the API server or Prometheus). kubebuilder's scaffold makes the same choice.
func TLSOpts(enableHTTP2 bool) []func(*tls.Config) {
	if enableHTTP2 {
		return nil
	}
	return []func(*tls.Config){func(c *tls.Config) { c.NextProtos = []string{"http/1.1"} }}
}
