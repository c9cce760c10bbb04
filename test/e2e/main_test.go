//go:build e2e

package e2e

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/ironlb/ironlb/api/v1beta1"
	"github.com/ironlb/ironlb/test/lab/labctl"
)

// Environment variables:
//
//	E2E_KUBECONFIG  kubeconfig of a running cluster; empty: the suite brings the
//	                lab up itself (root, Kubernetes binaries in bin/) and tears it
//	                down at the end
//	E2E_HOSTS       lab (default) or docker (kind: docker exec into nodes and client)
//	E2E_CLIENT      docker: the client container (default mypc)
//	E2E_INSTALL     0: do not helm upgrade --install the chart (it is installed)
//	E2E_KEEP_LAB    1: leave the lab the suite brought up running
//	LAB_WORKERS, LAB_SERVICE_CIDR, LAB_IP_FAMILY, LAB_PROXY_MODE  the lab the suite brings up
//	                (default 3 workers, 10.200.1.0/24, dual), as for make lab-up
//	LAB_PROMETHEUS  0: the suite's lab runs no Prometheus (TestPrometheus* skip)
//	LAB_DNS         0: the suite's lab runs no DNS host (TestSpreadOneService starts it)
//	E2E_PROBE       path of e2e-probe (./test/e2e/cmd/e2e-probe) on the client;
//	                lab: built by the suite; docker: unset means curl loops
//	E2E_KUBECTL, E2E_HELM  binaries (default bin/kubectl, bin/helm, else PATH)
const (
	// Namespace is the install namespace (the walkthrough's).
	Namespace = "metallb-system"
	// Release is the Helm release name; the chart's objects are named after it.
	Release = "ironlb"
)

// env is the cluster under test; nil when skipReason says why not.
var (
	env        *Env
	skipReason string
)

// Env is what the tests use: clients, binaries and the hosts.
type Env struct {
	Root       string
	Kubeconfig string
	Kubectl    string
	Helm       string
	Hosts      Hosts
	// Probe is the e2e-probe binary's path on the client ("": none; the
	// tests that need it skip).
	Probe string
	// Ephemeral: the suite brought the lab up and takes it down at the end,
	// so what a benchmark creates need not be deleted one by one.
	Ephemeral bool
	CS        kubernetes.Interface
	C         client.WithWatch
	// Impl is the load-balancer implementation installed: ironlb, unless
	// BenchmarkVersusMetalLB has switched to MetalLB.
	Impl *lbImpl
}

// lbImpl is a load-balancer implementation in Namespace: the objects the tests wait on and
// how it is installed and removed (with its CRDs and the namespace).
type lbImpl struct {
	name string
	// controller (Deployment), speaker (DaemonSet) and webhookService are its objects.
	controller, speaker, webhookService string
	// speakerLabels select its speaker pods.
	speakerLabels map[string]string
	install       func(e *Env, ctx context.Context) error
	uninstall     func(e *Env, ctx context.Context) error
}

// ironlbImpl is the chart's release, installed as the walkthrough does.
var ironlbImpl = &lbImpl{
	name:       "ironlb",
	controller: Release + "-controller", speaker: Release + "-speaker", webhookService: Release + "-webhook-service",
	speakerLabels: map[string]string{"app.kubernetes.io/component": "speaker"},
	install:       (*Env).install,
	uninstall:     (*Env).uninstall,
}

func TestMain(m *testing.M) {
	os.Exit(runMain(m))
}

func runMain(m *testing.M) int {
	ctx := context.Background()
	e, teardown, reason, err := setup(ctx)
	if err != nil {
		fmt.Fprintf(os.Stderr, "e2e setup failed: %v\n", err)
		if teardown != nil {
			teardown()
		}
		return 1
	}
	env, skipReason = e, reason
	code := m.Run()
	if teardown != nil {
		teardown()
	}
	return code
}

// requireEnv skips the test when there is no cluster.
func requireEnv(t *testing.T) *Env {
	t.Helper()
	if env == nil {
		t.Skip(skipReason)
	}
	return env
}

func setup(ctx context.Context) (*Env, func(), string, error) {
	wd, _ := os.Getwd()
	root, err := labctl.FindRoot(wd)
	if err != nil {
		return nil, nil, "", err
	}
	e := &Env{Impl: ironlbImpl, Root: root, Kubectl: tool(root, "E2E_KUBECTL", "kubectl"), Helm: tool(root, "E2E_HELM", "helm")}
	var teardown func()
	kubeconfig := os.Getenv("E2E_KUBECONFIG")
	hosts := os.Getenv("E2E_HOSTS")
	lab := labctl.New(root, os.Stderr)
	switch hosts {
	case "", "lab":
		e.Hosts = LabHosts{Lab: lab}
	case "docker":
		client := os.Getenv("E2E_CLIENT")
		if client == "" {
			client = ClientHost
		}
		e.Hosts = DockerHosts{Client: client}
	default:
		return nil, nil, "", fmt.Errorf("E2E_HOSTS=%q: want lab or docker", hosts)
	}
	if kubeconfig == "" {
		if hosts == "docker" {
			return nil, nil, "", errors.New("E2E_HOSTS=docker needs E2E_KUBECONFIG (the kind cluster's kubeconfig)")
		}
		if os.Geteuid() != 0 {
			return nil, nil, "e2e: the lab needs root (network namespaces): run `sudo make test-e2e`, or set E2E_KUBECONFIG (and E2E_HOSTS) for a running cluster", nil
		}
		if err := lab.CheckKubeBinaries(); err != nil {
			return nil, nil, fmt.Sprintf("e2e: no Kubernetes binaries for the lab (%v): run `make tools`", err), nil
		}
		st, _ := lab.ReadState()
		wasUp := st != nil && st.Ready && lab.Healthy(ctx) == nil
		start := time.Now()
		// The suite's lab runs Prometheus (TestPrometheus) unless
		// LAB_PROMETHEUS=0, and the DNS host (TestSpreadOneService) unless
		// LAB_DNS=0.
		if err := lab.Up(ctx, labctl.UpOptions{Workers: getenvInt("LAB_WORKERS", 3), ServiceCIDR: os.Getenv("LAB_SERVICE_CIDR"),
			IPFamily: os.Getenv("LAB_IP_FAMILY"), ProxyMode: os.Getenv("LAB_PROXY_MODE"), Prometheus: os.Getenv("LAB_PROMETHEUS") != "0",
			DNS: os.Getenv("LAB_DNS") != "0"}); err != nil {
			return nil, nil, "", fmt.Errorf("lab up: %w", err)
		}
		fmt.Fprintf(os.Stderr, "e2e: lab up in %.1fs\n", time.Since(start).Seconds())
		if !wasUp && os.Getenv("E2E_KEEP_LAB") != "1" {
			e.Ephemeral = true
			teardown = func() {
				if err := lab.Down(context.Background(), labctl.DownOptions{KeepLogs: true}); err != nil {
					fmt.Fprintf(os.Stderr, "e2e: lab down: %v\n", err)
				}
			}
		}
		kubeconfig = lab.Kubeconfig()
	}
	e.Kubeconfig = kubeconfig
	e.Probe = os.Getenv("E2E_PROBE")
	if _, isLab := e.Hosts.(LabHosts); isLab && e.Probe == "" {
		// The lab's hosts share this machine's filesystem.
		dir, err := os.MkdirTemp("", "ironlb-e2e-")
		if err != nil {
			return nil, teardown, "", err
		}
		e.Probe = filepath.Join(dir, "e2e-probe")
		if out, err := e.run(ctx, "go", "build", "-o", e.Probe, "./test/e2e/cmd/e2e-probe"); err != nil {
			return nil, teardown, "", fmt.Errorf("building e2e-probe: %w\n%s", err, out)
		}
		prev := teardown
		teardown = func() {
			if err := os.RemoveAll(dir); err != nil {
				fmt.Fprintf(os.Stderr, "e2e: removing %s: %v\n", dir, err)
			}
			if prev != nil {
				prev()
			}
		}
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return nil, teardown, "", fmt.Errorf("kubeconfig %s: %w", kubeconfig, err)
	}
	cfg.QPS, cfg.Burst = 50, 100
	if e.CS, err = kubernetes.NewForConfig(cfg); err != nil {
		return nil, teardown, "", err
	}
	scheme := runtime.NewScheme()
	_ = clientgoscheme.AddToScheme(scheme)
	_ = v1beta1.AddToScheme(scheme)
	if e.C, err = client.NewWithWatch(cfg, client.Options{Scheme: scheme}); err != nil {
		return nil, teardown, "", err
	}
	if os.Getenv("E2E_INSTALL") != "0" {
		start := time.Now()
		if err := e.install(ctx); err != nil {
			return nil, teardown, "", err
		}
		fmt.Fprintf(os.Stderr, "e2e: ironlb installed and ready in %.1fs\n", time.Since(start).Seconds())
	}
	return e, teardown, "", nil
}

// tool returns $VAR, else bin/name if present, else name (from PATH).
func tool(root, envVar, name string) string {
	if v := os.Getenv(envVar); v != "" {
		return v
	}
	if p := filepath.Join(root, "bin", name); fileExists(p) {
		return p
	}
	return name
}

func fileExists(p string) bool { _, err := os.Stat(p); return err == nil }

// install runs the walkthrough's helm install (idempotent) and waits for the
// controller, the speakers and the webhook. --reset-values: a bare helm
// upgrade would keep the values an earlier test (setChartValues) or run set.
func (e *Env) install(ctx context.Context) error {
	out, err := e.run(ctx, e.Helm, "--kubeconfig", e.Kubeconfig, "upgrade", "--install", Release,
		filepath.Join(e.Root, "charts", "ironlb"), "-n", Namespace, "--create-namespace", "--reset-values")
	if err != nil {
		return fmt.Errorf("helm install: %w\n%s", err, out)
	}
	return e.waitReady(ctx, 3*time.Minute)
}

// uninstall removes ironlb completely: helm uninstall (the chart's pre-delete hook releases
// the IPs), then the CRDs Helm keeps (crds/) and the namespace.
func (e *Env) uninstall(ctx context.Context) error {
	if out, err := e.run(ctx, e.Helm, "--kubeconfig", e.Kubeconfig, "uninstall", Release, "-n", Namespace, "--wait", "--timeout", "2m", "--ignore-not-found"); err != nil {
		return fmt.Errorf("helm uninstall: %w\n%s", err, out)
	}
	if out, err := e.kubectl(ctx, "", "delete", "-f", filepath.Join(e.Root, "charts", "ironlb", "crds"), "--ignore-not-found", "--wait", "--timeout=2m"); err != nil {
		return fmt.Errorf("deleting ironlb's CRDs: %w\n%s", err, out)
	}
	if out, err := e.kubectl(ctx, "", "delete", "namespace", Namespace, "--ignore-not-found", "--wait", "--timeout=3m"); err != nil {
		return fmt.Errorf("deleting namespace %s: %w\n%s", Namespace, err, out)
	}
	return nil
}

// waitReady waits until the controller Deployment and speaker DaemonSet are
// fully rolled out and Ready and the webhook Service has a ready endpoint.
func (e *Env) waitReady(ctx context.Context, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	var why string
	for time.Now().Before(deadline) {
		why = e.notReady(ctx)
		if why == "" {
			return nil
		}
		time.Sleep(time.Second)
	}
	return fmt.Errorf("%s not ready after %s: %s", e.Impl.name, timeout, why)
}

// notReady says why the installed implementation is not ready ("" when it is).
func (e *Env) notReady(ctx context.Context) string {
	var d appsv1.Deployment
	if err := e.C.Get(ctx, client.ObjectKey{Namespace: Namespace, Name: e.Impl.controller}, &d); err != nil {
		return err.Error()
	}
	want := int32(1)
	if d.Spec.Replicas != nil {
		want = *d.Spec.Replicas
	}
	if d.Status.ObservedGeneration < d.Generation || d.Status.UpdatedReplicas != want || d.Status.ReadyReplicas != want || d.Status.Replicas != want {
		return fmt.Sprintf("controller: %d/%d ready, %d updated, %d total", d.Status.ReadyReplicas, want, d.Status.UpdatedReplicas, d.Status.Replicas)
	}
	var ds appsv1.DaemonSet
	if err := e.C.Get(ctx, client.ObjectKey{Namespace: Namespace, Name: e.Impl.speaker}, &ds); err != nil {
		return err.Error()
	}
	s := ds.Status
	if s.ObservedGeneration < ds.Generation || s.DesiredNumberScheduled == 0 || s.NumberReady != s.DesiredNumberScheduled ||
		s.UpdatedNumberScheduled != s.DesiredNumberScheduled || s.NumberAvailable != s.DesiredNumberScheduled {
		return fmt.Sprintf("speakers: %d/%d ready, %d updated", s.NumberReady, s.DesiredNumberScheduled, s.UpdatedNumberScheduled)
	}
	var slices discoveryv1.EndpointSliceList
	if err := e.C.List(ctx, &slices, client.InNamespace(Namespace), client.MatchingLabels{"kubernetes.io/service-name": e.Impl.webhookService}); err != nil {
		return err.Error()
	}
	for _, sl := range slices.Items {
		for _, ep := range sl.Endpoints {
			if ep.Conditions.Ready != nil && *ep.Conditions.Ready {
				return ""
			}
		}
	}
	return "webhook Service has no ready endpoint"
}

// run runs a local command, returning stdout+stderr.
func (e *Env) run(ctx context.Context, name string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = e.Root
	var b bytes.Buffer
	cmd.Stdout, cmd.Stderr = &b, &b
	err := cmd.Run()
	return b.String(), err
}

// kubectl runs kubectl against the cluster; stdin may be "".
func (e *Env) kubectl(ctx context.Context, stdin string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, e.Kubectl, append([]string{"--kubeconfig", e.Kubeconfig}, args...)...)
	if stdin != "" {
		cmd.Stdin = strings.NewReader(stdin)
	}
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		return out.String() + errb.String(), fmt.Errorf("kubectl %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(errb.String()))
	}
	return out.String(), nil
}
