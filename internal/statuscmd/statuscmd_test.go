package statuscmd

import (
	"bytes"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ironlb/ironlb/internal/statusview"
)

func TestParseTarget(t *testing.T) {
	for _, tc := range []struct {
		arg     string
		want    statusview.Filter
		wantErr bool
	}{
		{"", statusview.Filter{}, false},
		{"svc1", statusview.Filter{Service: "myns/svc1"}, false},
		{"default/svc1", statusview.Filter{Service: "default/svc1"}, false},
		{"172.18.255.200", statusview.Filter{IP: "172.18.255.200"}, false},
		{"::ffff:172.18.255.200", statusview.Filter{IP: "172.18.255.200"}, false},
		{"fd00::0001", statusview.Filter{IP: "fd00::1"}, false},
		{"a/b/c", statusview.Filter{}, true},
		{"/svc1", statusview.Filter{}, true},
	} {
		got, err := parseTarget([]string{tc.arg}, "myns")
		if (err != nil) != tc.wantErr || got != tc.want {
			t.Errorf("parseTarget(%q) = %+v, %v; want %+v, error %v", tc.arg, got, err, tc.want, tc.wantErr)
		}
		if err != nil && !strings.Contains(err.Error(), tc.arg) {
			t.Errorf("error %q does not name the argument", err)
		}
	}
}

func TestHealthAddress(t *testing.T) {
	for _, tc := range []struct {
		name    string
		c       corev1.Container
		want    string
		wantErr bool
	}{
		{"defaults", corev1.Container{Args: []string{"speaker"}}, "127.0.0.1:17472", false},
		{"chart's flag", corev1.Container{Args: []string{"speaker", "--health-probe-port=17999"}}, "127.0.0.1:17999", false},
		{"separate value, host", corev1.Container{Command: []string{"/ironlb", "speaker", "--health-probe-port", "18000", "--health-probe-host=::1"}}, "[::1]:18000", false},
		{"every address", corev1.Container{Args: []string{"--health-probe-host="}}, "127.0.0.1:17472", false},
		{"environment", corev1.Container{Env: []corev1.EnvVar{{Name: "METALLB_HEALTH_PROBE_PORT", Value: "17500"}}}, "127.0.0.1:17500", false},
		{"flag over environment", corev1.Container{Args: []string{"--health-probe-port=17501"}, Env: []corev1.EnvVar{{Name: "METALLB_HEALTH_PROBE_PORT", Value: "17500"}}}, "127.0.0.1:17501", false},
		{"disabled", corev1.Container{Name: "speaker", Args: []string{"--health-probe-port=0"}}, "", true},
	} {
		got, err := healthAddress(tc.c)
		if (err != nil) != tc.wantErr || got != tc.want {
			t.Errorf("%s: %q, %v; want %q, error %v", tc.name, got, err, tc.want, tc.wantErr)
		}
	}
}

func TestLocalCommand(t *testing.T) {
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "ironlb-speaker-abcde"},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "speaker", Args: []string{"speaker", "--health-probe-port=17472"}}}},
		Status:     corev1.PodStatus{Phase: corev1.PodRunning},
	}
	argv, err := localCommand(pod, "speaker", statusview.Filter{Service: "default/svc1", Segment: true})
	if want := []string{"/ironlb", "status", "--local", "--address", "127.0.0.1:17472", "default/svc1"}; err != nil || !slices.Equal(argv, want) {
		t.Errorf("argv %q, %v; want %q", argv, err, want)
	}
	argv, err = localCommand(pod, "speaker", statusview.Filter{Service: "default/svc1"})
	if want := []string{"/ironlb", "status", "--local", "--address", "127.0.0.1:17472", "--segment=false", "default/svc1"}; err != nil || !slices.Equal(argv, want) {
		t.Errorf("argv without the segment survey %q, %v; want %q", argv, err, want)
	}
	if _, err := localCommand(pod, "other", statusview.Filter{}); err == nil || !strings.Contains(err.Error(), `"other"`) {
		t.Errorf("unknown container: %v", err)
	}
	pod.Status.Phase = corev1.PodPending
	if _, err := localCommand(pod, "speaker", statusview.Filter{}); err == nil || !strings.Contains(err.Error(), "Pending") {
		t.Errorf("pending pod: %v", err)
	}
}

func TestDecodeSnapshot(t *testing.T) {
	if s, err := decodeSnapshot([]byte(`{"schemaVersion":1,"node":"w1","services":[]}`)); err != nil || s.Node != "w1" {
		t.Errorf("v1: %+v, %v", s, err)
	}
	if _, err := decodeSnapshot([]byte(`{"schemaVersion":2}`)); err == nil || !strings.Contains(err.Error(), "schemaVersion 2") {
		t.Errorf("v2: %v", err)
	}
	if _, err := decodeSnapshot([]byte(`exec: not found`)); err == nil {
		t.Error("garbage accepted")
	}
}

// --local copies the health server's answer, and passes the filter on.
func TestRunLocal(t *testing.T) {
	var query string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != statusview.Path {
			http.NotFound(w, r)
			return
		}
		query = r.URL.RawQuery
		if r.URL.Query().Get("ip") == "300.0.0.1" {
			http.Error(w, "bad ip", http.StatusBadRequest)
			return
		}
		_, _ = fmt.Fprint(w, `{"schemaVersion":1}`)
	}))
	defer srv.Close()
	addr := strings.TrimPrefix(srv.URL, "http://")
	var out bytes.Buffer
	if err := runLocal(t.Context(), addr, []string{"default/svc1"}, false, &out); err != nil || out.String() != `{"schemaVersion":1}` || query != "service=default%2Fsvc1" {
		t.Errorf("runLocal: %v, out %q, query %q", err, out.String(), query)
	}
	if err := runLocal(t.Context(), addr, []string{"172.18.255.200"}, true, &out); err != nil || query != "ip=172.18.255.200&segment=1" {
		t.Errorf("runLocal by IP, asking the segment: %v, query %q", err, query)
	}
	srv.Close()
	if err := runLocal(t.Context(), addr, nil, false, &out); err == nil {
		t.Error("no error with the server gone")
	}
}

func TestExitCode(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want int
	}{
		{nil, 0},
		{errors.New("flag"), 1},
		{&ExitError{Code: 1, Err: errors.New("2 problem(s) found")}, 1},
		{fmt.Errorf("wrapped: %w", &ExitError{Code: 2, Err: errors.New("no speaker")}), 2},
	} {
		if got := ExitCode(tc.err); got != tc.want {
			t.Errorf("ExitCode(%v) = %d, want %d", tc.err, got, tc.want)
		}
	}
}
