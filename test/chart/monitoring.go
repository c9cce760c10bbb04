package chart

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"

	"sigs.k8s.io/yaml"
)

// KubeVersion is the Kubernetes version the chart is rendered for.
const KubeVersion = "v1.37.1"

// RuleFile renders the chart's PrometheusRule (prometheus.prometheusRule.enabled=true
// plus the given --set values) with helm and returns its spec as a Prometheus rule
// file (`groups:`), the form `promtool` and a plain Prometheus load: the alerts a
// Prometheus Operator would load from the chart, without the operator.
func RuleFile(ctx context.Context, helm, chartDir string, set ...string) ([]byte, error) {
	args := []string{"template", "ironlb", chartDir, "--kube-version", KubeVersion, "--namespace", "metallb-system",
		"--show-only", "templates/monitoring.yaml", "--set", "prometheus.prometheusRule.enabled=true"}
	for _, s := range set {
		args = append(args, "--set", s)
	}
	cmd := exec.CommandContext(ctx, helm, args...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("helm template (rules): %w: %s", err, strings.TrimSpace(stderr.String()))
	}
	for _, doc := range strings.Split(string(out), "\n---") {
		var obj struct {
			Kind string `json:"kind"`
			Spec struct {
				Groups json.RawMessage `json:"groups"`
			} `json:"spec"`
		}
		if err := yaml.Unmarshal([]byte(doc), &obj); err != nil {
			return nil, fmt.Errorf("parsing the rendered chart: %w", err)
		}
		if obj.Kind != "PrometheusRule" {
			continue
		}
		var groups any
		if err := json.Unmarshal(obj.Spec.Groups, &groups); err != nil {
			return nil, fmt.Errorf("PrometheusRule spec.groups: %w", err)
		}
		return yaml.Marshal(map[string]any{"groups": groups})
	}
	return nil, errors.New("the rendered chart has no PrometheusRule")
}

// Alerts returns the alert names of a rule file, in order.
func Alerts(ruleFile []byte) ([]string, error) {
	var f struct {
		Groups []struct {
			Rules []struct {
				Alert string `json:"alert"`
			} `json:"rules"`
		} `json:"groups"`
	}
	if err := yaml.Unmarshal(ruleFile, &f); err != nil {
		return nil, fmt.Errorf("parsing the rule file: %w", err)
	}
	var names []string
	for _, g := range f.Groups {
		for _, r := range g.Rules {
			if r.Alert != "" {
				names = append(names, r.Alert)
			}
		}
	}
	return names, nil
}

// PanelQuery is one query of a dashboard panel.
type PanelQuery struct {
	Panel string
	RefID string
	Expr  string
}

// DashboardQueries returns every panel's queries (targets[].expr) of a Grafana
// dashboard JSON file, such as the chart's dashboards/ironlb.json.
func DashboardQueries(path string) ([]PanelQuery, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var d struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				RefID string `json:"refId"`
				Expr  string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(b, &d); err != nil {
		return nil, fmt.Errorf("dashboard %s: %w", path, err)
	}
	var qs []PanelQuery
	for _, p := range d.Panels {
		if len(p.Targets) == 0 {
			return nil, fmt.Errorf("dashboard %s: panel %q has no query", path, p.Title)
		}
		for _, t := range p.Targets {
			if strings.TrimSpace(t.Expr) == "" {
				return nil, fmt.Errorf("dashboard %s: panel %q query %s: empty expr", path, p.Title, t.RefID)
			}
			qs = append(qs, PanelQuery{Panel: p.Title, RefID: t.RefID, Expr: t.Expr})
		}
	}
	return qs, nil
}

// ExpandGrafanaVars replaces Grafana's interval variables with fixed durations so a
// dashboard query runs against Prometheus' API directly.
func ExpandGrafanaVars(expr, rateInterval string) string {
	return strings.NewReplacer("$__rate_interval", rateInterval, "${__rate_interval}", rateInterval,
		"$__interval", rateInterval, "${__interval}", rateInterval).Replace(expr)
}
