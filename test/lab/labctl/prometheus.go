package labctl

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"syscall"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/ironlb/ironlb/test/lab/labnet"
)

// The lab's Prometheus (lab up --prometheus) runs on its own host, labnet.PrometheusName,
// outside the cluster like mypc. It discovers ironlb's pods through the API server
// (kubernetes_sd_configs) and scrapes them over HTTPS, both with a token of the service
// account the chart's prometheus.serviceAccount / prometheus.namespace values name by
// default, so only the RBAC the chart grants it (rbacPrometheus) lets it in.
const (
	PrometheusPort           = 9090
	PrometheusNamespace      = "monitoring"
	PrometheusServiceAccount = "prometheus-k8s"
	// PrometheusScrapeInterval is also the rule evaluation interval: short, so that
	// tests see a change within seconds.
	PrometheusScrapeInterval = 2 * time.Second
	// prometheusProc names its pid file and log.
	prometheusProc = "prometheus"
	// prometheusTokenTTL outlives any lab session (the token is not refreshed).
	prometheusTokenTTL = 30 * 24 * time.Hour
)

// PrometheusURL is the lab Prometheus' address as lab hosts see it.
func PrometheusURL() string {
	return "http://" + netip.AddrPortFrom(labnet.PrometheusIP, PrometheusPort).String()
}

// PrometheusDir holds the lab Prometheus' configuration, token and data.
func (l *Lab) PrometheusDir() string { return filepath.Join(l.StateDir(), "prometheus") }

// PrometheusRulesDir holds rule files (*.yml) the lab Prometheus loads; see
// SetPrometheusRules.
func (l *Lab) PrometheusRulesDir() string { return filepath.Join(l.PrometheusDir(), "rules") }

// prometheusConfig is the lab Prometheus' configuration: every ironlb pod's "metrics"
// port in the metallb-system namespace, job "ironlb-<component>" (as the chart's
// alerts expect: the job contains "<fullname>-<component>").
func (l *Lab) prometheusConfig(t *labnet.Topology) string {
	dir := l.PrometheusDir()
	token := filepath.Join(dir, "token")
	iv := PrometheusScrapeInterval.String()
	return fmt.Sprintf(`# Written by lab up --prometheus.
global:
  scrape_interval: %[1]s
  scrape_timeout: %[1]s
  evaluation_interval: %[1]s
rule_files: [%[2]q]
scrape_configs:
- job_name: ironlb
  scheme: https
  # ironlb's metrics certificate is self-signed, as with the chart's ServiceMonitor.
  tls_config: {insecure_skip_verify: true}
  authorization: {credentials_file: %[3]q}
  kubernetes_sd_configs:
  - role: pod
    api_server: %[4]q
    namespaces: {names: [metallb-system]}
    authorization: {credentials_file: %[3]q}
    tls_config: {ca_file: %[5]q}
  relabel_configs:
  - source_labels: [__meta_kubernetes_pod_label_app_kubernetes_io_name, __meta_kubernetes_pod_container_port_name]
    regex: ironlb;metrics
    action: keep
  - source_labels: [__meta_kubernetes_pod_label_app_kubernetes_io_component]
    target_label: job
    replacement: ironlb-$1
  - source_labels: [__meta_kubernetes_namespace]
    target_label: namespace
  - source_labels: [__meta_kubernetes_pod_name]
    target_label: pod
  - source_labels: [__meta_kubernetes_pod_container_name]
    target_label: container
`, iv, filepath.Join(l.PrometheusRulesDir(), "*.yml"), token, apiURL(t), l.pki("ca.crt"))
}

// startPrometheus creates Prometheus' service account and a token for it, writes the
// configuration and starts Prometheus on the monitoring host, waiting until it is ready.
func (l *Lab) startPrometheus(ctx context.Context, t *labnet.Topology, c kubernetes.Interface) error {
	h, ok := t.Host(labnet.PrometheusName)
	if !ok {
		return fmt.Errorf("the topology has no %s host", labnet.PrometheusName)
	}
	// Built from the Go module proxy (hack/prometheus): Debian's package has no
	// kubernetes_sd_configs.
	exe := l.bin("prometheus")
	if _, err := os.Stat(exe); err != nil {
		return fmt.Errorf("lab up --prometheus needs %s: build it with `make prometheus` (pinned in hack/prometheus/go.mod): %w", exe, err)
	}
	token, err := prometheusToken(ctx, c)
	if err != nil {
		return err
	}
	dir := l.PrometheusDir()
	if err := os.MkdirAll(l.PrometheusRulesDir(), 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "token"), []byte(token), 0o600); err != nil {
		return err
	}
	config := filepath.Join(dir, "prometheus.yml")
	if err := os.WriteFile(config, []byte(l.prometheusConfig(t)), 0o644); err != nil {
		return err
	}
	if _, err := l.start(Proc{Name: prometheusProc, NS: h.NS(), Args: []string{exe,
		"--config.file=" + config, "--storage.tsdb.path=" + filepath.Join(dir, "data"),
		"--storage.tsdb.retention.time=1d", "--web.listen-address=" + netip.AddrPortFrom(netip.IPv4Unspecified(), PrometheusPort).String(),
		"--log.level=warn"}}); err != nil {
		return err
	}
	return waitHTTPOK(ctx, h.NS(), PrometheusURL()+"/-/ready", 60*time.Second)
}

// prometheusToken creates the monitoring namespace and Prometheus' service account (if
// missing) and returns a token of it.
func prometheusToken(ctx context.Context, c kubernetes.Interface) (string, error) {
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: PrometheusNamespace}}
	if _, err := c.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return "", fmt.Errorf("creating namespace %s: %w", PrometheusNamespace, err)
	}
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: PrometheusServiceAccount, Namespace: PrometheusNamespace}}
	if _, err := c.CoreV1().ServiceAccounts(PrometheusNamespace).Create(ctx, sa, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return "", fmt.Errorf("creating service account %s/%s: %w", PrometheusNamespace, PrometheusServiceAccount, err)
	}
	ttl := int64(prometheusTokenTTL.Seconds())
	tr, err := c.CoreV1().ServiceAccounts(PrometheusNamespace).CreateToken(ctx, PrometheusServiceAccount,
		&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &ttl}}, metav1.CreateOptions{})
	if err != nil {
		return "", fmt.Errorf("requesting a token of %s/%s: %w", PrometheusNamespace, PrometheusServiceAccount, err)
	}
	return tr.Status.Token, nil
}

var ruleFileName = regexp.MustCompile(`^[a-z0-9][a-z0-9-]*$`)

// SetPrometheusRules writes a rule file (Prometheus' `groups:` format) named NAME.yml into
// PrometheusRulesDir, or removes it when data is nil, and makes the lab Prometheus reload
// its configuration (SIGHUP). The reload is asynchronous: poll /api/v1/rules for the result.
func (l *Lab) SetPrometheusRules(name string, data []byte) error {
	if !ruleFileName.MatchString(name) {
		return fmt.Errorf("rule file name %q: want lower-case letters, digits and dashes", name)
	}
	pid, err := l.prometheusPid()
	if err != nil {
		return err
	}
	path := filepath.Join(l.PrometheusRulesDir(), name+".yml")
	if data == nil {
		if err := os.Remove(path); err != nil && !os.IsNotExist(err) {
			return err
		}
	} else if err := os.WriteFile(path, data, 0o644); err != nil {
		return err
	}
	if err := syscall.Kill(pid, syscall.SIGHUP); err != nil {
		return fmt.Errorf("reloading Prometheus (pid %d): %w", pid, err)
	}
	return nil
}

// PrometheusRunning reports whether the lab runs its Prometheus.
func (l *Lab) PrometheusRunning() bool {
	_, err := l.prometheusPid()
	return err == nil
}

func (l *Lab) prometheusPid() (int, error) {
	pid, err := readPid(l.pidFile(prometheusProc))
	if err == nil && (pid == 0 || !alive(pid)) {
		err = fmt.Errorf("pid %d exited", pid)
	}
	if err != nil {
		return 0, fmt.Errorf("the lab's Prometheus is not running (start the lab with `lab up --prometheus` or LAB_PROMETHEUS=1): %w", err)
	}
	return pid, nil
}
