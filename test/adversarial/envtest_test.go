package adversarial_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	crwebhook "sigs.k8s.io/controller-runtime/pkg/webhook"

	"github.com/ironlb/ironlb/controllers"
	"github.com/ironlb/ironlb/internal/webhook"
	"github.com/ironlb/ironlb/test/adversarial"
)

const (
	installNS = "metallb-system"
	serviceNS = "adversarial"
	// The test API server's Service network and the pod network of its one node:
	// the corpus refers to them as ${SERVICE_CIDR} and ${POD_CIDR}.
	serviceCIDR = "10.96.0.0/16,fd00:10:96::/112"
	podCIDR     = "10.244.1.0/24"
)

// TestCorpus sends the whole corpus through a real kube-apiserver (envtest) with
// the validating webhooks registered as in the chart and the controller running, so
// CRD schema, webhook and controller events are all exercised in their real order.
func TestCorpus(t *testing.T) {
	cases, err := adversarial.Load("cases")
	if err != nil {
		t.Fatal(err)
	}
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(root, "bin")
	for _, b := range []string{"kube-apiserver", "etcd"} {
		if _, err := os.Stat(filepath.Join(bin, b)); err != nil {
			t.Skipf("envtest needs %s/%s (build it with `make tools`): %v", bin, b, err)
		}
	}
	log := testr.NewWithOptions(t, testr.Options{Verbosity: 0})
	logf.SetLogger(log)
	env := &envtest.Environment{
		CRDDirectoryPaths:     []string{filepath.Join(root, "config", "crd", "bases")},
		ErrorIfCRDPathMissing: true,
		BinaryAssetsDirectory: bin,
		WebhookInstallOptions: envtest.WebhookInstallOptions{Paths: []string{filepath.Join(root, "config", "webhook")}},
		Scheme:                controllers.Scheme(),
	}
	env.ControlPlane.GetAPIServer().Configure().Set("service-cluster-ip-range", serviceCIDR)
	cfg, err := env.Start()
	if err != nil {
		t.Fatalf("starting envtest: %v", err)
	}
	t.Cleanup(func() {
		if err := env.Stop(); err != nil {
			t.Errorf("stopping envtest: %v", err)
		}
	})

	c, err := client.New(cfg, client.Options{Scheme: controllers.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	for _, obj := range []client.Object{
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: installNS}},
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: serviceNS}},
		&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "worker-1"}, Spec: corev1.NodeSpec{PodCIDR: podCIDR, PodCIDRs: []string{podCIDR}}},
	} {
		if err := c.Create(ctx, obj); err != nil {
			t.Fatal(err)
		}
	}

	// The webhooks, served on envtest's local endpoint...
	hook := &env.WebhookInstallOptions
	mgr, err := manager.New(cfg, manager.Options{
		Scheme:  controllers.Scheme(),
		Metrics: metricsserver.Options{BindAddress: "0"},
		WebhookServer: crwebhook.NewServer(crwebhook.Options{
			Host: hook.LocalServingHost, Port: hook.LocalServingPort, CertDir: hook.LocalServingCertDir,
		}),
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := webhook.Setup(mgr, installNS); err != nil {
		t.Fatal(err)
	}
	// ...and the controller, for the Service cases (events).
	done := make(chan error, 2)
	go func() { done <- mgr.Start(ctx) }()
	go func() {
		done <- controllers.Run(ctx, controllers.Options{
			Namespace: installNS, WebhookMode: controllers.WebhookModeDisabled,
			RESTConfig: cfg, Logger: log.WithName("controller"),
		})
	}()
	t.Cleanup(func() {
		cancel()
		for range 2 {
			if err := <-done; err != nil {
				t.Errorf("stopping: %v", err)
			}
		}
	})
	check := mgr.GetWebhookServer().StartedChecker()
	if err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 60*time.Second, true, func(context.Context) (bool, error) {
		return check(nil) == nil, nil
	}); err != nil {
		t.Fatalf("webhook server not serving: %v", err)
	}

	adversarial.Run(t, adversarial.Env{Config: cfg, InstallNS: installNS, ServiceNS: serviceNS}, cases)
	if n := len(cases); n < 80 {
		t.Errorf("the corpus has %d cases, want at least 80", n)
	}
}
