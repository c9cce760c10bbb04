package chart

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"
)

// requireTool returns bin/NAME, a pinned tool `make tools` builds (helm; promtool from
// hack/prometheus, also `make prometheus`). Missing, the test skips, and fails in CI (CI=true), where make
// tools runs first.
func requireTool(t *testing.T, name string) string {
	t.Helper()
	p := filepath.Join(repoRoot(t), "bin", name)
	if _, err := os.Stat(p); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("needs %s (make tools): %v", p, err)
		}
		t.Skipf("skipping: needs %s (make tools): %v", p, err)
	}
	return p
}

func repoRoot(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	return root
}

// TestAlertRules renders the chart's alerts with the default values, checks them
// with `promtool check rules` and runs the unit tests in testdata/alerts_test.yaml,
// which must cover every alert the chart renders.
func TestAlertRules(t *testing.T) {
	helm := requireTool(t, "helm")
	promtool := requireTool(t, "promtool")
	ctx := context.Background()
	rules, err := RuleFile(ctx, helm, filepath.Join(repoRoot(t), "charts", "ironlb"))
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "rules.yml"), rules, 0o644); err != nil {
		t.Fatal(err)
	}
	tests, err := os.ReadFile(filepath.Join("testdata", "alerts_test.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "alerts_test.yaml"), tests, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{{"check", "rules", "rules.yml"}, {"test", "rules", "alerts_test.yaml"}} {
		cmd := exec.CommandContext(ctx, promtool, args...)
		cmd.Dir = dir
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Errorf("promtool %s: %v\n%s\nrules.yml:\n%s", strings.Join(args, " "), err, out, rules)
		}
	}

	alerts, err := Alerts(rules)
	if err != nil {
		t.Fatal(err)
	}
	var cases struct {
		Tests []struct {
			AlertRuleTest []struct {
				Alertname string `json:"alertname"`
			} `json:"alert_rule_test"`
		} `json:"tests"`
	}
	if err := yaml.Unmarshal(tests, &cases); err != nil {
		t.Fatal(err)
	}
	tested := map[string]bool{}
	for _, c := range cases.Tests {
		for _, a := range c.AlertRuleTest {
			tested[a.Alertname] = true
		}
	}
	for _, a := range alerts {
		if !tested[a] {
			t.Errorf("alert %s has no case in testdata/alerts_test.yaml", a)
		}
	}
	if len(alerts) < 8 {
		t.Errorf("the chart rendered %d alerts (%v), want every default one", len(alerts), alerts)
	}
}

// TestAlertDurationsFromValues checks that each alert's `for` comes from its value
// (the lab shortens them) and that turning an alert off removes it.
func TestAlertDurationsFromValues(t *testing.T) {
	helm := requireTool(t, "helm")
	rules, err := RuleFile(context.Background(), helm, filepath.Join(repoRoot(t), "charts", "ironlb"),
		"prometheus.prometheusRule.speakerMissing.for=7s", "prometheus.prometheusRule.addressPoolUsage.for=9s",
		"prometheus.prometheusRule.addressConflict.enabled=false")
	if err != nil {
		t.Fatal(err)
	}
	var f struct {
		Groups []struct {
			Rules []struct {
				Alert string `json:"alert"`
				For   string `json:"for"`
			} `json:"rules"`
		} `json:"groups"`
	}
	if err := yaml.Unmarshal(rules, &f); err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, r := range f.Groups[0].Rules {
		got[r.Alert] = r.For
	}
	for alert, want := range map[string]string{"IronLBSpeakerMissing": "7s", "MetalLBAddressPoolUsage75Percent": "9s", "MetalLBAddressPoolExhausted": "1m"} {
		if got[alert] != want {
			t.Errorf("%s: for %q, want %q", alert, got[alert], want)
		}
	}
	if _, ok := got["IronLBAddressConflict"]; ok {
		t.Error("IronLBAddressConflict rendered with addressConflict.enabled=false")
	}
}

// TestDashboard checks the dashboard file (every panel has queries on the selected
// Prometheus data source) and that the chart ships it unchanged in a ConfigMap with
// the sidecar's label, only when enabled.
func TestDashboard(t *testing.T) {
	path := filepath.Join(repoRoot(t), "charts", "ironlb", "dashboards", "ironlb.json")
	qs, err := DashboardQueries(path)
	if err != nil {
		t.Fatal(err)
	}
	for _, metric := range []string{"metallb_speaker_announced", "ironlb_owner_changes_total", "ironlb_memberlist_members",
		"ironlb_layer2_conflicts_total", "metallb_layer2_requests_received", "metallb_layer2_responses_sent", "metallb_allocator_addresses_in_use_total"} {
		if !slices.ContainsFunc(qs, func(q PanelQuery) bool { return strings.Contains(q.Expr, metric) }) {
			t.Errorf("no panel queries %s", metric)
		}
	}
	file, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		UID    string `json:"uid"`
		Panels []struct {
			ID         int               `json:"id"`
			Title      string            `json:"title"`
			Datasource map[string]string `json:"datasource"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(file, &d); err != nil {
		t.Fatal(err)
	}
	ids := map[int]bool{}
	for _, p := range d.Panels {
		if ids[p.ID] {
			t.Errorf("panel %q: duplicate id %d", p.Title, p.ID)
		}
		ids[p.ID] = true
		if p.Datasource["uid"] != "${datasource}" {
			t.Errorf("panel %q: datasource %v, want the ${datasource} variable", p.Title, p.Datasource)
		}
	}

	requireTool(t, "helm")
	if strings.Contains(string(render(t)), "grafana_dashboard") {
		t.Error("the dashboard ConfigMap is rendered by default; it must be opt-in")
	}
	var cm corev1.ConfigMap
	mustUnmarshal(t, string(render(t, "--set", "grafanaDashboard.enabled=true", "--show-only", "templates/dashboard.yaml")), &cm)
	if cm.Labels["grafana_dashboard"] != "1" {
		t.Errorf("ConfigMap labels %v, want grafana_dashboard: \"1\"", cm.Labels)
	}
	if cm.Data["ironlb.json"] != strings.TrimRight(string(file), "\n") {
		t.Error("the ConfigMap's ironlb.json differs from charts/ironlb/dashboards/ironlb.json")
	}
}
