package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"k8s.io/client-go/rest"
)

// waitReconciled polls the controller's metrics until its service controller has
// completed at least n reconciles and its queue is empty.
func waitReconciled(port int, n int64, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	url := fmt.Sprintf("http://127.0.0.1:%d/metrics", port)
	var last string
	for time.Now().Before(deadline) {
		resp, err := http.Get(url)
		if err == nil {
			body, _ := io.ReadAll(resp.Body)
			_ = resp.Body.Close()
			total := metricSum(string(body), "controller_runtime_reconcile_total", `controller="service"`)
			depth := metricSum(string(body), "workqueue_depth", `name="service"`)
			last = fmt.Sprintf("reconciles %v, queue depth %v", total, depth)
			if total >= float64(n) && depth == 0 {
				return nil
			}
		} else {
			last = err.Error()
		}
		time.Sleep(20 * time.Millisecond)
	}
	return fmt.Errorf("restart: not reconciled within %s (%s)", timeout, last)
}

// metricSum adds the values of every sample of name whose labels contain match.
func metricSum(text, name, match string) float64 {
	var sum float64
	for _, line := range strings.Split(text, "\n") {
		if !strings.HasPrefix(line, name+"{") || !strings.Contains(line, match) {
			continue
		}
		f := strings.Fields(line)
		if v, err := strconv.ParseFloat(f[len(f)-1], 64); err == nil {
			sum += v
		}
	}
	return sum
}

// printClientStats shows how many requests the controller made, by method, and how
// long client-side rate limiting delayed them: the cost per Service.
func printClientStats(port int) error {
	resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/metrics", port))
	if err != nil {
		return fmt.Errorf("reading controller metrics: %w", err)
	}
	defer func() { _ = resp.Body.Close() }()
	body, _ := io.ReadAll(resp.Body)
	text := string(body)
	var parts []string
	for _, m := range []string{"GET", "LIST", "PATCH", "POST", "PUT", "WATCH"} {
		if v := metricSum(text, "rest_client_requests_total", `method="`+m+`"`); v > 0 {
			parts = append(parts, fmt.Sprintf("%s %.0f", m, v))
		}
	}
	fmt.Printf("controller API requests: %s; client rate-limiter wait total %.1fs\n",
		strings.Join(parts, ", "), metricSum(text, "rest_client_rate_limiter_duration_seconds_sum", ""))
	return nil
}

// apiRequests reads the API server's apiserver_request_total, summed by verb,
// resource and subresource ("PATCH services/status"): every client's requests, counted
// where they are served, so any controller can be measured the same way.
func apiRequests(ctx context.Context, rc rest.Interface) (map[string]float64, error) {
	body, err := rc.Get().AbsPath("/metrics").DoRaw(ctx)
	if err != nil {
		return nil, fmt.Errorf("reading the API server's metrics: %w", err)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	families, err := p.TextToMetricFamilies(strings.NewReader(string(body)))
	if err != nil {
		return nil, fmt.Errorf("parsing the API server's metrics: %w", err)
	}
	out := map[string]float64{}
	fam, ok := families["apiserver_request_total"]
	if !ok {
		return nil, errors.New("the API server's metrics have no apiserver_request_total")
	}
	for _, m := range fam.GetMetric() {
		l := map[string]string{}
		for _, lp := range m.GetLabel() {
			l[lp.GetName()] = lp.GetValue()
		}
		key := l["verb"] + " " + l["resource"]
		if l["subresource"] != "" {
			key += "/" + l["subresource"]
		}
		out[key] += m.GetCounter().GetValue()
	}
	return out, nil
}

// requestsPerService formats the requests served between two apiRequests snapshots, per
// service, largest first, and returns their total; long-running WATCH requests and
// kinds under 0.01 per service are left out.
func requestsPerService(before, after map[string]float64, services int) (string, float64) {
	type row struct {
		key string
		n   float64
	}
	var rows []row
	total := 0.0
	for k, v := range after {
		d := (v - before[k]) / float64(services)
		if d < 0.01 || strings.HasPrefix(k, "WATCH") {
			continue
		}
		rows = append(rows, row{k, d})
		total += d
	}
	slices.SortFunc(rows, func(a, b row) int {
		if a.n != b.n {
			return cmp.Compare(b.n, a.n)
		}
		return strings.Compare(a.key, b.key)
	})
	parts := []string{fmt.Sprintf("%.2f in all", total)}
	for _, r := range rows {
		parts = append(parts, fmt.Sprintf("%s %.2f", r.key, r.n))
	}
	return strings.Join(parts, ", "), total
}

// saveProfile writes what get returns to path, reporting a failure without stopping
// the benchmark (a profile is a diagnostic, not a figure).
func saveProfile(get func() ([]byte, error), path string) {
	b, err := get()
	if err == nil {
		err = os.WriteFile(path, b, 0o600)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "controller-bench: CPU profile %s: %v\n", path, err)
	}
}

func fetch(url, path string) error {
	resp, err := http.Get(url)
	if err != nil {
		return fmt.Errorf("fetching %s: %w", url, err)
	}
	defer func() { _ = resp.Body.Close() }()
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	_, err = io.Copy(f, resp.Body)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}
func pct(sorted []time.Duration, p int) time.Duration {
	i := (len(sorted)*p + 99) / 100
	if i > 0 {
		i--
	}
	return sorted[i].Round(10 * time.Microsecond)
}
