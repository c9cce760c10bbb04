package labctl

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ironlb/ironlb/test/lab/labnet"
)

// TestPrometheusConfig checks the lab Prometheus' configuration with the pinned
// `promtool check config` (which also checks the token and CA files it names exist).
// Without bin/promtool it skips, and fails in CI, where make tools builds it.
func TestPrometheusConfig(t *testing.T) {
	root, err := FindRoot(".")
	if err != nil {
		t.Fatal(err)
	}
	promtool := filepath.Join(root, "bin", "promtool")
	if _, err := os.Stat(promtool); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("needs %s (make tools): %v", promtool, err)
		}
		t.Skipf("skipping: needs %s (make tools): %v", promtool, err)
	}
	l := New(t.TempDir(), &bytes.Buffer{})
	topo, err := labnet.New(1)
	if err != nil {
		t.Fatal(err)
	}
	topo.AddPrometheus()
	for _, dir := range []string{l.PrometheusRulesDir(), l.PKIDir()} {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, f := range []string{filepath.Join(l.PrometheusDir(), "token"), l.pki("ca.crt")} {
		if err := os.WriteFile(f, []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	config := filepath.Join(l.PrometheusDir(), "prometheus.yml")
	cfg := l.prometheusConfig(topo)
	if err := os.WriteFile(config, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(promtool, "check", "config", config).CombinedOutput()
	if err != nil {
		t.Fatalf("promtool check config: %v\n%s\n%s", err, out, cfg)
	}
	for _, want := range []string{"https://172.18.0.2:6443", "names: [metallb-system]", "regex: ironlb;metrics", "replacement: ironlb-$1"} {
		if !strings.Contains(cfg, want) {
			t.Errorf("config lacks %q:\n%s", want, cfg)
		}
	}
}
