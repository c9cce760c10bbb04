package whoami

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

func TestHandler(t *testing.T) {
	srv := httptest.NewServer(Handler("web-7d9f"))
	defer srv.Close()
	req, _ := http.NewRequest("GET", srv.URL+"/some/path?x=1", nil)
	req.Header.Set("X-Test", "yes")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	for _, want := range []string{"Hostname: web-7d9f\n", "IP: 127.0.0.1\n", "RemoteAddr: 127.0.0.1:", "GET /some/path?x=1 HTTP/1.1\n", "X-Test: yes\n"} {
		if !strings.Contains(string(body), want) {
			t.Errorf("answer lacks %q:\n%s", want, body)
		}
	}
	if !strings.HasPrefix(string(body), "Hostname: ") {
		t.Errorf("answer does not start with the Hostname line:\n%s", body)
	}
	resp, err = http.Get(srv.URL + "/health")
	if err != nil {
		t.Fatalf("/health: %v", err)
	}
	_ = resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("/health: %v", resp.Status)
	}
}
