package controllers_test

import (
	"crypto/tls"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/ironlb/ironlb/controllers"
)

// With --webhook-mode=enabled the controller creates the webhook certificate, puts
// its CA into the ValidatingWebhookConfiguration, serves the webhooks over TLS and
// only then reports ready. (The API server cannot reach the webhook Service here,
// so the configuration used matches no namespace; internal/webhook's own tests
// cover admission through the API server.)
func TestWebhookModeEnabled(t *testing.T) {
	hookPort, probePort := freePort(t), freePort(t)
	certDir := t.TempDir()
	var vwcName string
	h := newHarness(t, func(o *controllers.Options) {
		o.DeploymentName = "ironlb-controller"
		vwcName = "ilb-test-webhooks-" + o.Namespace
		o.WebhookMode = controllers.WebhookModeEnabled
		o.WebhookPort = hookPort
		o.WebhookCertDir = certDir
		o.WebhookWriteCerts = true
		o.WebhookConfigurationName = vwcName
		o.HealthProbeBindAddress = fmt.Sprintf("127.0.0.1:%d", probePort)
	})
	vwc := testWebhookConfiguration(vwcName, h.installNS)
	h.create(vwc)
	t.Cleanup(func() { _ = k8s.Delete(h.ctx, vwc) })
	dep := controllerDeployment(h.installNS, h.opts.DeploymentName)
	h.create(dep)
	h.start()

	h.eventually("/readyz to answer 200", func() (bool, string) {
		resp, err := (&http.Client{Timeout: 5 * time.Second}).Get(fmt.Sprintf("http://127.0.0.1:%d/readyz", probePort))
		if err != nil {
			return false, err.Error()
		}
		_ = resp.Body.Close()
		return resp.StatusCode == http.StatusOK, resp.Status
	})
	if err := k8s.Get(h.ctx, client.ObjectKeyFromObject(vwc), vwc); err != nil {
		t.Fatal(err)
	}
	if len(vwc.Webhooks[0].ClientConfig.CABundle) == 0 {
		t.Error("the CA was not injected into the ValidatingWebhookConfiguration")
	}
	for _, f := range []string{"tls.crt", "tls.key"} {
		if _, err := os.Stat(filepath.Join(certDir, f)); err != nil {
			t.Errorf("certificate file: %v", err)
		}
	}
	// The webhook server answers TLS at MetalLB's path (an empty body is a bad
	// request, which is enough to show the handler is registered and serving).
	c := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		TLSClientConfig:   &tls.Config{InsecureSkipVerify: true}, //nolint:gosec // self-signed, test only
		ForceAttemptHTTP2: true,
	}}
	resp, err := c.Post(fmt.Sprintf("https://127.0.0.1:%d/validate-metallb-io-v1beta1-ipaddresspool", hookPort), "application/json", nil)
	if err != nil {
		t.Fatalf("calling the webhook: %v", err)
	}
	_ = resp.Body.Close()
	if resp.StatusCode == http.StatusNotFound {
		t.Errorf("webhook path not served: %s", resp.Status)
	}
	// HTTP/2 is off unless --enable-http2 (rapid-reset advisories): a client
	// offering h2 gets HTTP/1.1.
	if resp.Proto != "HTTP/1.1" {
		t.Errorf("the webhook server negotiated %s with a client offering h2, want HTTP/1.1", resp.Proto)
	}

	// The certificate Secret is owned by the controller Deployment, so the
	// garbage collector removes it on helm uninstall.
	var secret corev1.Secret
	if err := k8s.Get(h.ctx, client.ObjectKey{Namespace: h.installNS, Name: "ironlb-webhook-cert"}, &secret); err != nil {
		t.Fatal(err)
	}
	if refs := secret.OwnerReferences; len(refs) != 1 || refs[0].Kind != "Deployment" || refs[0].Name != dep.Name || refs[0].UID != dep.UID {
		t.Errorf("webhook certificate secret owners = %+v, want the deployment %s (uid %s)", refs, dep.Name, dep.UID)
	}

	// Allocation works alongside.
	h.pool("first-pool", "172.18.255.200-172.18.255.250")
	h.create(h.service("svc", nil))
	h.waitIPs("svc", "172.18.255.200")
}

func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = l.Close() }()
	return l.Addr().(*net.TCPAddr).Port
}

// controllerDeployment is a minimal Deployment standing for the controller's own
// (envtest runs no pods; it only needs to exist to own objects).
func controllerDeployment(ns, name string) *appsv1.Deployment {
	labels := map[string]string{"app": name}
	return &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: appsv1.DeploymentSpec{
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "controller", Image: "ghcr.io/ironlb/ironlb:test"}}},
			},
		},
	}
}

// testWebhookConfiguration is a ValidatingWebhookConfiguration named name,
// pointing at the install namespace's webhook Service, that
// matches no namespace: the shared test API server never calls it.
func testWebhookConfiguration(name, installNS string) *admissionregistrationv1.ValidatingWebhookConfiguration {
	return &admissionregistrationv1.ValidatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Webhooks: []admissionregistrationv1.ValidatingWebhook{{
			Name: "ipaddresspoolvalidationwebhook.metallb.io",
			ClientConfig: admissionregistrationv1.WebhookClientConfig{Service: &admissionregistrationv1.ServiceReference{
				Namespace: installNS, Name: "ironlb-webhook-service", Path: ptr.To("/validate-metallb-io-v1beta1-ipaddresspool"),
			}},
			Rules: []admissionregistrationv1.RuleWithOperations{{
				Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create},
				Rule:       admissionregistrationv1.Rule{APIGroups: []string{"metallb.io"}, APIVersions: []string{"v1beta1"}, Resources: []string{"ipaddresspools"}},
			}},
			NamespaceSelector:       &metav1.LabelSelector{MatchLabels: map[string]string{"ilb-never": "true"}},
			FailurePolicy:           ptr.To(admissionregistrationv1.Ignore),
			SideEffects:             ptr.To(admissionregistrationv1.SideEffectClassNone),
			AdmissionReviewVersions: []string{"v1"},
		}},
	}
}
