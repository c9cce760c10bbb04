package controllers_test

import (
	"fmt"
	"testing"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/ironlb/ironlb/api/v1beta1"
	"github.com/ironlb/ironlb/controllers"
	"github.com/ironlb/ironlb/internal/configstate"
)

// The controller runs with exactly the RBAC the chart gives it (templates/rbac.yaml
// rendered by bin/helm, its ServiceAccount impersonated): it issues the webhook
// certificate, injects the CA, creates the memberlist key, allocates and elects a
// leader, although it may neither read other Secrets of its namespace (Helm keeps
// release Secrets there) nor read or change other webhook configurations.
func TestControllerWithChartRBAC(t *testing.T) {
	hookPort := freePort(t)
	h := newHarness(t)
	h.applyChartRBAC("templates/rbac.yaml")
	const vwcName = "ironlb-webhook-configuration" // the chart's name, granted by resourceNames
	h.opts.RESTConfig = h.impersonate("ironlb-controller")
	h.opts.DeploymentName = "ironlb-controller"
	h.opts.LeaderElect = true
	h.opts.WebhookMode = controllers.WebhookModeEnabled
	h.opts.WebhookPort = hookPort
	h.opts.WebhookCertDir = t.TempDir()
	h.opts.WebhookWriteCerts = true
	h.opts.WebhookConfigurationName = vwcName
	h.opts.WebhookSecretName = "ironlb-webhook-cert"
	h.opts.MemberlistSecretName = "ironlb-memberlist"

	vwc := testWebhookConfiguration(vwcName, h.installNS)
	h.create(vwc)
	t.Cleanup(func() { _ = k8s.Delete(h.ctx, vwc) })
	h.create(controllerDeployment(h.installNS, h.opts.DeploymentName))
	h.create(&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: h.installNS, Name: "sh.helm.release.v1.ironlb.v1"},
		StringData: map[string]string{"release": "values with credentials"}})

	// What the chart must not allow.
	sa, err := client.New(h.opts.RESTConfig, client.Options{Scheme: controllers.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	for what, err := range map[string]error{
		"list the Secrets of its namespace": sa.List(h.ctx, &corev1.SecretList{}, client.InNamespace(h.installNS)),
		"read the Helm release Secret":      sa.Get(h.ctx, client.ObjectKey{Namespace: h.installNS, Name: "sh.helm.release.v1.ironlb.v1"}, &corev1.Secret{}),
		"list every webhook configuration":  sa.List(h.ctx, &admissionregistrationv1.ValidatingWebhookConfigurationList{}),
	} {
		if !apierrors.IsForbidden(err) {
			t.Errorf("the controller's ServiceAccount can %s (err %v)", what, err)
		}
	}

	h.start()
	h.eventually("the CA in the webhook configuration and both Secrets created", func() (bool, string) {
		if err := k8s.Get(h.ctx, client.ObjectKeyFromObject(vwc), vwc); err != nil {
			return false, err.Error()
		}
		var cert, ml corev1.Secret
		certErr := k8s.Get(h.ctx, client.ObjectKey{Namespace: h.installNS, Name: "ironlb-webhook-cert"}, &cert)
		mlErr := k8s.Get(h.ctx, client.ObjectKey{Namespace: h.installNS, Name: "ironlb-memberlist"}, &ml)
		ok := len(vwc.Webhooks[0].ClientConfig.CABundle) > 0 && certErr == nil && len(cert.Data["tls.crt"]) > 0 &&
			mlErr == nil && len(ml.Data[controllers.MemberlistSecretKey]) == 32
		return ok, fmt.Sprintf("caBundle %d bytes, cert secret %v (%d keys), memberlist secret %v", len(vwc.Webhooks[0].ClientConfig.CABundle), certErr, len(cert.Data), mlErr)
	})
	h.pool("first-pool", "172.18.255.200-172.18.255.250")
	h.create(h.service("svc", nil))
	h.waitIPs("svc", "172.18.255.200")
	h.eventually("the controller's ConfigurationState written", func() (bool, string) {
		var cs v1beta1.ConfigurationState
		err := k8s.Get(h.ctx, client.ObjectKey{Namespace: h.installNS, Name: configstate.ControllerName}, &cs)
		return err == nil && cs.Status.Result == v1beta1.ConfigurationResultValid, fmt.Sprintf("%v %+v", err, cs.Status)
	})
	h.running()
}
