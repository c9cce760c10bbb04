//go:build e2e

package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/ironlb/ironlb/api/v1beta1"
	"github.com/ironlb/ironlb/test/chart"
	"github.com/ironlb/ironlb/test/lab/labctl"
	"github.com/ironlb/ironlb/test/lab/labnet"
)

// The lab Prometheus' alerts are the chart's, with short `for` durations and a short
// conflict window so that each fires and resolves within seconds.
var promRuleValues = []string{
	"prometheus.prometheusRule.staleConfig.for=4s", "prometheus.prometheusRule.configNotLoaded.for=4s",
	"prometheus.prometheusRule.addressPoolExhausted.for=4s", "prometheus.prometheusRule.addressPoolUsage.for=4s",
	"prometheus.prometheusRule.speakerMissing.for=4s", "prometheus.prometheusRule.addressConflict.window=20s",
}

// promPool is this test's pool: two addresses, both taken to exhaust it.
var promPool = []string{"172.18.254.120", "172.18.254.121"}

// TestPrometheus runs against the lab's Prometheus (lab up --prometheus), which
// discovers ironlb's pods through the API server and scrapes them with the token of
// the service account the chart's RBAC (prometheus.rbacPrometheus) admits:
//   - every target (each speaker, both controller replicas) is up;
//   - every metric family docs/configuration.md lists is scraped: the unlabelled
//     ones from every pod of its component, the labelled ones from at least one
//     (a standby controller allocates nothing, only an owner answers ARP);
//   - every query of the chart's Grafana dashboard returns series;
//   - the chart's alerts fire on injected faults and resolve after them: a pool
//     exhausted (MetalLBAddressPoolExhausted), an address conflict (mypc answering
//     ARP for an announced IP: IronLBAddressConflict), a speaker frozen
//     (IronLBSpeakerMissing).
//
// With E2E_DASHBOARD_CAPTURE=FILE it also cuts a node's link (a failover) and writes
// the dashboard's range queries over the test to FILE, from which
// hack/dashboard-png draws docs/images/dashboard.png.
func TestPrometheus(t *testing.T) {
	e := requireEnv(t)
	lab := requirePrometheus(t, e)
	sig := e.signaller(t)
	ips := applyWalkthrough(t, e)
	dumpOnFailure(t, e, nil)
	ctx := ctxT(t)
	start := time.Now()
	prom := promClient{e}
	var events timeline

	rules, err := chart.RuleFile(ctx, e.Helm, filepath.Join(e.Root, "charts", "ironlb"), promRuleValues...)
	if err != nil {
		t.Fatal(err)
	}
	alertNames, err := chart.Alerts(rules)
	if err != nil {
		t.Fatal(err)
	}
	if err := lab.SetPrometheusRules("ironlb", rules); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := lab.SetPrometheusRules("ironlb", nil); err != nil {
			t.Errorf("removing the rules: %v", err)
		}
	})
	t.Cleanup(func() {
		if !t.Failed() {
			return
		}
		var targets struct {
			ActiveTargets []struct {
				Labels    map[string]string `json:"labels"`
				Health    string            `json:"health"`
				LastError string            `json:"lastError"`
			} `json:"activeTargets"`
		}
		err := prom.get(context.Background(), "/api/v1/targets", nil, &targets)
		t.Logf("---- Prometheus targets (err %v):", err)
		for _, tg := range targets.ActiveTargets {
			t.Logf("%s %s %s %s", tg.Labels["job"], tg.Labels["pod"], tg.Health, tg.LastError)
		}
		var alerts json.RawMessage
		err = prom.get(context.Background(), "/api/v1/alerts", nil, &alerts)
		t.Logf("---- Prometheus alerts (err %v): %s", err, alerts)
	})

	// Targets: every ironlb pod, up.
	var pods corev1.PodList
	if err := e.C.List(ctx, &pods, client.InNamespace(Namespace), client.MatchingLabels{"app.kubernetes.io/name": "ironlb"}); err != nil {
		t.Fatal(err)
	}
	byComponent := map[string][]string{}
	for _, p := range pods.Items {
		if c := p.Labels["app.kubernetes.io/component"]; p.DeletionTimestamp == nil && (c == "speaker" || c == "controller") {
			byComponent[c] = append(byComponent[c], p.Name)
		}
	}
	if len(byComponent["controller"]) != 2 || len(byComponent["speaker"]) == 0 {
		t.Fatalf("ironlb pods %v: want 2 controllers and a speaker per node", byComponent)
	}
	poll(t, 90*time.Second, "Prometheus scraping every ironlb pod", func() (bool, string) {
		up, err := prom.query(ctx, `up{job=~"ironlb-.*"} == 1`)
		if err != nil {
			return false, err.Error()
		}
		var have []string
		for _, s := range up {
			have = append(have, s.Metric["pod"])
		}
		for _, names := range byComponent {
			for _, n := range names {
				if !slices.Contains(have, n) {
					return false, fmt.Sprintf("%s is not scraped (up: %v)", n, have)
				}
			}
		}
		return true, ""
	})
	poll(t, 30*time.Second, "the chart's alert rules loaded", func() (bool, string) {
		loaded, err := prom.ruleNames(ctx)
		if err != nil {
			return false, err.Error()
		}
		for _, a := range alertNames {
			if !slices.Contains(loaded, a) {
				return false, fmt.Sprintf("%s missing; loaded: %v", a, loaded)
			}
		}
		return true, ""
	})

	// Faults 1 and 2: the pool exhausted, and mypc claiming its first address.
	poolObj := &v1beta1.IPAddressPool{
		ObjectMeta: metav1.ObjectMeta{Name: "e2e-prom-pool", Namespace: Namespace},
		Spec:       v1beta1.IPAddressPoolSpec{Addresses: []string{promPool[0] + "-" + promPool[1]}, AutoAssign: ptr(false)},
	}
	adv := &v1beta1.L2Advertisement{
		ObjectMeta: metav1.ObjectMeta{Name: "e2e-prom-adv", Namespace: Namespace},
		Spec:       v1beta1.L2AdvertisementSpec{IPAddressPools: []string{poolObj.Name}},
	}
	e.create(t, poolObj)
	e.create(t, adv)
	var svcs []*corev1.Service
	for _, name := range []string{"e2e-prom-a", "e2e-prom-b"} {
		svc := lbService(name, "webpod", "")
		svc.Annotations["metallb.io/address-pool"] = poolObj.Name
		e.create(t, svc)
		svcs = append(svcs, svc)
	}
	victimIP := e.waitIngressIP(t, "default", "e2e-prom-a")
	e.waitIngressIP(t, "default", "e2e-prom-b")
	events.add("pool exhausted")
	owner := e.waitAnnouncer(t, "default", "e2e-prom-a", "")
	events.add("mypc claims " + victimIP)
	release := e.claimFromClient(t, victimIP)

	// ARP requests for the walkthrough's IPs, so the layer-2 counters have series.
	for _, ip := range ips {
		if r, err := e.Hosts.Run(ctx, ClientHost, "arping", "-c", "2", "-w", "3", "-i", "eth0", ip); err != nil || r.Code != 0 {
			t.Errorf("arping %s from %s: %v %s%s", ip, ClientHost, err, r.Stdout, r.Stderr)
		}
	}
	prom.waitAlert(t, "MetalLBAddressPoolExhausted", "pool", poolObj.Name, true)
	prom.waitAlert(t, "IronLBAddressConflict", "ip", victimIP, true)

	// Every documented family, from every pod that must have it.
	e.checkMetricFamilies(t, prom, byComponent)
	// Every dashboard query returns series.
	queries, err := chart.DashboardQueries(filepath.Join(e.Root, "charts", "ironlb", "dashboards", "ironlb.json"))
	if err != nil {
		t.Fatal(err)
	}
	poll(t, 30*time.Second, "every dashboard query returning series", func() (bool, string) {
		var empty []string
		for _, q := range queries {
			res, err := prom.query(ctx, chart.ExpandGrafanaVars(q.Expr, "1m"))
			if err != nil {
				return false, fmt.Sprintf("panel %q %s: %v", q.Panel, q.Expr, err)
			}
			if len(res) == 0 {
				empty = append(empty, fmt.Sprintf("%q: %s", q.Panel, q.Expr))
			}
		}
		return len(empty) == 0, "no series for " + strings.Join(empty, "; ")
	})

	// mypc gives the address back: the conflict alert resolves once the window
	// (20 s here) has passed; checked at the end.
	release()
	events.add("mypc gives it back")

	// Resolved: a free address again.
	if err := e.C.Delete(ctx, svcs[1]); err != nil {
		t.Fatal(err)
	}
	events.add("pool freed")
	prom.waitAlert(t, "MetalLBAddressPoolExhausted", "pool", poolObj.Name, false)

	// Fault 3: a speaker frozen (not the victim's announcer), then thawed.
	var frozenNode string
	for _, p := range pods.Items {
		if p.Labels["app.kubernetes.io/component"] == "speaker" && p.Spec.NodeName != owner {
			frozenNode = p.Spec.NodeName
			break
		}
	}
	pod := e.speakerPodObj(t, frozenNode)
	thawed := false
	thaw := func() {
		if !thawed {
			thawed = true
			if err := sig.SignalContainer(context.Background(), pod, "speaker", syscall.SIGCONT); err != nil {
				t.Errorf("SIGCONT to the speaker on %s: %v", frozenNode, err)
			}
		}
	}
	t.Cleanup(thaw)
	if err := sig.SignalContainer(ctx, pod, "speaker", syscall.SIGSTOP); err != nil {
		thawed = true
		t.Fatal(err)
	}
	events.add("speaker on " + frozenNode + " frozen")
	prom.waitAlert(t, "IronLBSpeakerMissing", "", "", true)
	thaw()
	events.add("thawed")
	prom.waitAlert(t, "IronLBSpeakerMissing", "", "", false)
	poll(t, time.Minute, "ironlb ready after the thaw", func() (bool, string) {
		why := e.notReady(ctx)
		return why == "", why
	})
	prom.waitAlert(t, "IronLBAddressConflict", "ip", victimIP, false)

	if path := os.Getenv("E2E_DASHBOARD_CAPTURE"); path != "" {
		e.captureDashboard(t, prom, queries, start, &events, path)
	}
}

// skipOutsideCI returns t.Skipf, or t.Fatalf in CI, where the suite's own
// lab provides what a test needs and a skip would hide that it does not.
func skipOutsideCI(t *testing.T) func(format string, args ...any) {
	if os.Getenv("CI") == "true" {
		return t.Fatalf
	}
	return t.Skipf
}

// requirePrometheus returns the lab running Prometheus, or skips the test (fails it
// in CI, where the suite's own lab runs it).
func requirePrometheus(t *testing.T, e *Env) *labctl.Lab {
	t.Helper()
	skip := skipOutsideCI(t)
	lh, ok := e.Hosts.(LabHosts)
	if !ok {
		skip("needs the lab's Prometheus host (E2E_HOSTS=lab)")
	}
	if !lh.Lab.PrometheusRunning() {
		skip("the lab runs no Prometheus: bring it up with LAB_PROMETHEUS=1 (make lab-up) or let the suite bring its own lab up")
	}
	return lh.Lab
}

// claimFromClient makes mypc claim ip: it takes the address (so its kernel answers
// the speaker's re-check) and sends gratuitous ARP replies for it, past the speaker's
// conflict grace. The returned func (also a cleanup; once) gives the address back.
func (e *Env) claimFromClient(t *testing.T, ip string) (release func()) {
	t.Helper()
	ctx := ctxT(t)
	if r, err := e.Hosts.Run(ctx, ClientHost, "ip", "addr", "add", ip+"/32", "dev", "eth0"); err != nil || r.Code != 0 {
		t.Fatalf("adding %s to %s: %v %s", ip, ClientHost, err, r.Stderr)
	}
	released := false
	release = func() {
		if released {
			return
		}
		released = true
		if r, err := e.Hosts.Run(context.Background(), ClientHost, "ip", "addr", "del", ip+"/32", "dev", "eth0"); err != nil || r.Code != 0 {
			t.Errorf("removing %s from %s: %v %s", ip, ClientHost, err, r.Stderr)
		}
	}
	t.Cleanup(release)
	// One gratuitous reply a second for 6 s: past the speaker's 3 s grace.
	if r, err := e.Hosts.Run(ctx, ClientHost, "arping", "-q", "-U", "-P", "-S", ip, "-i", "eth0", "-c", "6", ip); err != nil {
		t.Fatalf("gratuitous ARP for %s from %s: %v %s", ip, ClientHost, err, r.Stderr)
	}
	return release
}

// event is something the test injected, for the dashboard capture.
type event struct {
	At   int64  `json:"at"`
	What string `json:"what"`
}

// timeline records when the test injected what.
type timeline []event

func (tl *timeline) add(what string) { *tl = append(*tl, event{time.Now().Unix(), what}) }

// documentedFamilies returns the metric families of docs/configuration.md's Metrics
// section by component, each with whether its table lists labels for it.
func documentedFamilies(t *testing.T, root string) map[string]map[string]bool {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, "docs", "configuration.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(b), "\n## Metrics\n")
	if !ok {
		t.Fatal("docs/configuration.md has no Metrics section")
	}
	name := regexp.MustCompile("`((?:metallb|ironlb)_[a-z0-9_]+)`")
	out := map[string]map[string]bool{"controller": {}, "speaker": {}}
	comp := ""
	for _, line := range strings.Split(section, "\n") {
		switch {
		case strings.HasPrefix(line, "Controller:"):
			comp = "controller"
		case strings.HasPrefix(line, "Speaker:"):
			comp = "speaker"
		case comp != "" && strings.HasPrefix(line, "| `"):
			cells := strings.Split(line, "|")
			labelled := strings.TrimSpace(cells[3]) != ""
			for _, m := range name.FindAllStringSubmatch(cells[1], -1) {
				out[comp][m[1]] = labelled
			}
		}
	}
	// "The speaker also sets the metallb_k8s_client_* series" (same section).
	for n, l := range out["controller"] {
		if strings.HasPrefix(n, "metallb_k8s_client_") {
			out["speaker"][n] = l
		}
	}
	if len(out["controller"]) < 8 || len(out["speaker"]) < 12 {
		t.Fatalf("parsed too few families from docs/configuration.md: %v", out)
	}
	return out
}

// checkMetricFamilies requires every documented family in Prometheus: an unlabelled
// one from every pod of its component, a labelled one from at least one.
func (e *Env) checkMetricFamilies(t *testing.T, prom promClient, pods map[string][]string) {
	t.Helper()
	ctx := ctxT(t)
	fams := documentedFamilies(t, e.Root)
	poll(t, 30*time.Second, "every documented metric family scraped", func() (bool, string) {
		var missing []string
		for comp, names := range fams {
			for name, labelled := range names {
				res, err := prom.query(ctx, fmt.Sprintf(`count by (pod) ({__name__=%q, job="ironlb-%s"})`, name, comp))
				if err != nil {
					return false, err.Error()
				}
				have := map[string]bool{}
				for _, s := range res {
					have[s.Metric["pod"]] = true
				}
				want := pods[comp]
				if labelled {
					if len(have) == 0 {
						missing = append(missing, fmt.Sprintf("%s from any %s", name, comp))
					}
					continue
				}
				for _, p := range want {
					if !have[p] {
						missing = append(missing, fmt.Sprintf("%s from %s", name, p))
					}
				}
			}
		}
		sort.Strings(missing)
		return len(missing) == 0, strings.Join(missing, ", ")
	})
}

// promClient queries the lab's Prometheus HTTP API from inside the lab (its own host).
type promClient struct{ e *Env }

type promSample struct {
	Metric map[string]string `json:"metric"`
	Value  [2]any            `json:"value"`
}

func (p promClient) get(ctx context.Context, path string, q url.Values, out any) error {
	u := labctl.PrometheusURL() + path
	if q != nil {
		u += "?" + q.Encode()
	}
	r, err := p.e.Hosts.Run(ctx, labnet.PrometheusName, "curl", "-sS", "-m", "10", u)
	if err != nil {
		return err
	}
	if r.Code != 0 {
		return fmt.Errorf("curl %s: exit %d: %s", u, r.Code, r.Stderr)
	}
	var env struct {
		Status string          `json:"status"`
		Data   json.RawMessage `json:"data"`
		Error  string          `json:"error"`
	}
	if err := json.Unmarshal([]byte(r.Stdout), &env); err != nil {
		return fmt.Errorf("%s: %w: %s", u, err, tailLines(r.Stdout, 5))
	}
	if env.Status != "success" {
		return fmt.Errorf("%s: %s %s", u, env.Status, env.Error)
	}
	return json.Unmarshal(env.Data, out)
}

func (p promClient) query(ctx context.Context, expr string) ([]promSample, error) {
	var d struct {
		ResultType string       `json:"resultType"`
		Result     []promSample `json:"result"`
	}
	if err := p.get(ctx, "/api/v1/query", url.Values{"query": {expr}}, &d); err != nil {
		return nil, err
	}
	if d.ResultType != "vector" {
		return nil, fmt.Errorf("%s: result type %s, want vector", expr, d.ResultType)
	}
	return d.Result, nil
}

func (p promClient) ruleNames(ctx context.Context) ([]string, error) {
	var d struct {
		Groups []struct {
			Rules []struct {
				Name string `json:"name"`
			} `json:"rules"`
		} `json:"groups"`
	}
	if err := p.get(ctx, "/api/v1/rules", nil, &d); err != nil {
		return nil, err
	}
	var names []string
	for _, g := range d.Groups {
		for _, r := range g.Rules {
			names = append(names, r.Name)
		}
	}
	return names, nil
}

// waitAlert waits until alert (with label=value, unless label is "") is firing, or
// until no such alert is pending or firing.
func (p promClient) waitAlert(t *testing.T, alert, label, value string, firing bool) {
	t.Helper()
	ctx := ctxT(t)
	what := fmt.Sprintf("%s{%s=%q} firing", alert, label, value)
	if !firing {
		what = fmt.Sprintf("%s{%s=%q} resolved", alert, label, value)
	}
	start := time.Now()
	poll(t, 90*time.Second, what, func() (bool, string) {
		var d struct {
			Alerts []struct {
				Labels map[string]string `json:"labels"`
				State  string            `json:"state"`
				Value  string            `json:"value"`
			} `json:"alerts"`
		}
		if err := p.get(ctx, "/api/v1/alerts", nil, &d); err != nil {
			return false, err.Error()
		}
		var seen []string
		state := ""
		for _, a := range d.Alerts {
			seen = append(seen, fmt.Sprintf("%s%v=%s", a.Labels["alertname"], a.Labels, a.State))
			if a.Labels["alertname"] == alert && (label == "" || a.Labels[label] == value) {
				state = a.State
			}
		}
		if firing {
			return state == "firing", fmt.Sprintf("alerts: %v", seen)
		}
		return state == "", fmt.Sprintf("alerts: %v", seen)
	})
	t.Logf("%s after %v", what, time.Since(start).Round(100*time.Millisecond))
}

// captureDashboard cuts the link of the node announcing svc1 for a few seconds (a
// failover), then writes every dashboard query's range over the test to path.
func (e *Env) captureDashboard(t *testing.T, prom promClient, queries []chart.PanelQuery, start time.Time, events *timeline, path string) {
	t.Helper()
	ctx := ctxT(t)
	cutter, ok := e.Hosts.(LinkCutter)
	if !ok {
		t.Fatal("E2E_DASHBOARD_CAPTURE needs the lab (a link cut)")
	}
	victim := e.waitAnnouncer(t, "default", "svc1", "")
	if err := cutter.SetNodeLink(ctx, victim, false); err != nil {
		t.Fatal(err)
	}
	events.add("link of " + victim + " cut")
	time.Sleep(10 * time.Second)
	if err := cutter.SetNodeLink(ctx, victim, true); err != nil {
		t.Fatal(err)
	}
	events.add("link back")
	poll(t, 2*time.Minute, "ironlb ready after the link came back", func() (bool, string) {
		why := e.notReady(ctx)
		return why == "", why
	})
	time.Sleep(20 * time.Second)
	type series struct {
		Metric map[string]string `json:"metric"`
		Values [][2]any          `json:"values"`
	}
	type capture struct {
		Panel  string   `json:"panel"`
		RefID  string   `json:"refId"`
		Expr   string   `json:"expr"`
		Result []series `json:"result"`
	}
	end := time.Now()
	var out []capture
	for _, q := range queries {
		var d struct {
			Result []series `json:"result"`
		}
		v := url.Values{"query": {chart.ExpandGrafanaVars(q.Expr, "20s")},
			"start": {strconv.FormatInt(start.Unix(), 10)}, "end": {strconv.FormatInt(end.Unix(), 10)}, "step": {"2"}}
		if err := prom.get(ctx, "/api/v1/query_range", v, &d); err != nil {
			t.Fatal(err)
		}
		out = append(out, capture{Panel: q.Panel, RefID: q.RefID, Expr: q.Expr, Result: d.Result})
	}
	b, err := json.Marshal(map[string]any{"start": start.Unix(), "end": end.Unix(), "events": *events, "queries": out})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("dashboard capture (%d queries, %d bytes, link of %s cut) in %s", len(out), len(b), victim, path)
}
