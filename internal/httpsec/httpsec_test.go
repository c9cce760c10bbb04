package httpsec

import (
	"crypto/tls"
	"net/http"
	"net/http/httptest"
	"testing"
)

// A server configured with TLSOpts(false) answers an HTTP/2-capable client with
// HTTP/1.1; with TLSOpts(true) it negotiates HTTP/2.
func TestTLSOpts(t *testing.T) {
	for _, tc := range []struct {
		http2 bool
		want  string
	}{{false, "HTTP/1.1"}, {true, "HTTP/2.0"}} {
		srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {}))
		srv.EnableHTTP2 = true
		srv.TLS = &tls.Config{NextProtos: []string{"h2", "http/1.1"}}
		for _, o := range TLSOpts(tc.http2) {
			o(srv.TLS)
		}
		srv.StartTLS()
		c := srv.Client()
		c.Transport.(*http.Transport).ForceAttemptHTTP2 = true
		resp, err := c.Get(srv.URL)
		if err != nil {
			t.Fatal(err)
		}
		_ = resp.Body.Close()
		srv.Close()
		if resp.Proto != tc.want {
			t.Errorf("enableHTTP2=%v: negotiated %s, want %s", tc.http2, resp.Proto, tc.want)
		}
	}
}
