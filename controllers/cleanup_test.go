package controllers_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/ironlb/ironlb/api/v1beta1"
	"github.com/ironlb/ironlb/controllers"
)

// Cleanup (the chart's pre-delete hook) stops the controller, releases the IPs of
// exactly the Services it allocated, deletes the ServiceL2Status objects and the
// Secrets of the install namespace, and can run again without effect.
func TestCleanup(t *testing.T) {
	h := newHarness(t)
	dep := controllerDeployment(h.installNS, "ironlb-controller")
	h.create(dep)

	withStatus := func(svc *corev1.Service, ip string) {
		t.Helper()
		h.create(svc)
		got := h.get(svc.Name)
		got.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: ip, IPMode: ptr.To(corev1.LoadBalancerIPModeVIP)}}
		if err := k8s.Status().Update(h.ctx, got); err != nil {
			t.Fatalf("setting the status of %s: %v", svc.Name, err)
		}
	}
	// Ours: annotated, no class.
	withStatus(h.service("ours", map[string]string{annoPool: "first-pool"}), "172.18.255.200")
	// Another class (another ironlb install or another implementation).
	other := h.service("other-class", map[string]string{annoPool: "first-pool"})
	other.Spec.LoadBalancerClass = ptr.To("example.com/other")
	withStatus(other, "172.18.255.201")
	// Not allocated by ironlb: no pool annotation.
	withStatus(h.service("foreign", nil), "192.0.2.10")

	for _, ns := range []string{h.installNS, h.ns} {
		h.create(&v1beta1.ServiceL2Status{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "l2-ours-abc"}})
		h.create(&v1beta1.ConfigurationState{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "speaker-" + ns}})
	}
	for _, name := range []string{"ironlb-memberlist", "ironlb-webhook-cert", "unrelated"} {
		h.create(&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: h.installNS, Name: name}})
	}

	opts := controllers.CleanupOptions{
		Namespace:            h.installNS,
		DeploymentName:       dep.Name,
		MemberlistSecretName: "ironlb-memberlist",
		WebhookSecretName:    "ironlb-webhook-cert",
		Timeout:              3 * time.Second,
		RESTConfig:           restCfg,
	}

	// A controller pod that does not go away: cleanup must stop, naming it,
	// before touching any Service.
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: h.installNS, Name: "ironlb-controller-abc", Labels: dep.Spec.Selector.MatchLabels},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "controller", Image: "ghcr.io/ironlb/ironlb:test"}}},
	}
	h.create(pod)
	err := controllers.Cleanup(context.Background(), opts)
	if err == nil || !strings.Contains(err.Error(), pod.Name) {
		t.Fatalf("cleanup with a controller pod left = %v, want an error naming %s", err, pod.Name)
	}
	if got := ingress(h.get("ours")); len(got) != 1 {
		t.Fatalf("ours was released while the controller still ran: %v", got)
	}
	if err := k8s.Delete(h.ctx, pod, client.GracePeriodSeconds(0)); err != nil {
		t.Fatal(err)
	}
	h.eventually("the pod to be gone", func() (bool, string) {
		err := k8s.Get(h.ctx, client.ObjectKeyFromObject(pod), &corev1.Pod{})
		return apierrors.IsNotFound(err), "pod still exists"
	})

	for run := 1; run <= 2; run++ {
		var out bytes.Buffer
		opts.Out = &out
		if err := controllers.Cleanup(context.Background(), opts); err != nil {
			t.Fatalf("cleanup run %d: %v\n%s", run, err, out.String())
		}
		t.Logf("cleanup run %d:\n%s", run, out.String())
		if run == 2 && !strings.Contains(out.String(), "released the IPs of 0 services") {
			t.Errorf("second run released something:\n%s", out.String())
		}

		var d appsv1.Deployment
		if err := k8s.Get(h.ctx, client.ObjectKeyFromObject(dep), &d); err != nil {
			t.Fatal(err)
		}
		if r := ptr.Deref(d.Spec.Replicas, -1); r != 0 {
			t.Errorf("deployment replicas = %d, want 0", r)
		}
		ours := h.get("ours")
		if got := ingress(ours); len(got) != 0 {
			t.Errorf("ours: ingress %v, want none", got)
		}
		if _, ok := ours.Annotations[annoPool]; ok {
			t.Errorf("ours still has %s", annoPool)
		}
		if got := ingress(h.get("other-class")); len(got) != 1 || h.get("other-class").Annotations[annoPool] == "" {
			t.Errorf("other-class was touched: ingress %v annotations %v", got, h.get("other-class").Annotations)
		}
		if got := ingress(h.get("foreign")); len(got) != 1 {
			t.Errorf("foreign was touched: ingress %v", got)
		}
		var l2 v1beta1.ServiceL2StatusList
		if err := k8s.List(h.ctx, &l2, client.InNamespace(h.installNS)); err != nil || len(l2.Items) != 0 {
			t.Errorf("servicel2statuses left in %s: %d (%v)", h.installNS, len(l2.Items), err)
		}
		if err := k8s.List(h.ctx, &l2, client.InNamespace(h.ns)); err != nil || len(l2.Items) != 1 {
			t.Errorf("servicel2statuses outside the install namespace: %d, want 1 kept (%v)", len(l2.Items), err)
		}
		var states v1beta1.ConfigurationStateList
		if err := k8s.List(h.ctx, &states, client.InNamespace(h.installNS)); err != nil || len(states.Items) != 0 {
			t.Errorf("configurationstates left in %s: %d (%v)", h.installNS, len(states.Items), err)
		}
		if err := k8s.List(h.ctx, &states, client.InNamespace(h.ns)); err != nil || len(states.Items) != 1 {
			t.Errorf("configurationstates outside the install namespace: %d, want 1 kept (%v)", len(states.Items), err)
		}
		for name, want := range map[string]bool{"ironlb-memberlist": false, "ironlb-webhook-cert": false, "unrelated": true} {
			err := k8s.Get(h.ctx, client.ObjectKey{Namespace: h.installNS, Name: name}, &corev1.Secret{})
			if exists := err == nil; exists != want {
				t.Errorf("secret %s exists = %v, want %v (%v)", name, exists, want, err)
			}
		}
	}
}

// The chart's pre-delete hook runs Cleanup with its own ServiceAccount: with
// exactly the RBAC the chart gives it (rendered by bin/helm, applied to the test
// API server, the ServiceAccount impersonated), Cleanup succeeds.
func TestCleanupWithHookRBAC(t *testing.T) {
	h := newHarness(t)
	h.applyChartRBAC("templates/cleanup-hook.yaml")

	dep := controllerDeployment(h.installNS, "ironlb-controller")
	h.create(dep)
	h.create(h.service("ours", map[string]string{annoPool: "first-pool"}))
	svc := h.get("ours")
	svc.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: "172.18.255.200"}}
	if err := k8s.Status().Update(h.ctx, svc); err != nil {
		t.Fatal(err)
	}
	h.create(&v1beta1.ServiceL2Status{ObjectMeta: metav1.ObjectMeta{Namespace: h.installNS, Name: "l2-ours"}})
	for _, name := range []string{"ironlb-memberlist", "ironlb-webhook-cert"} {
		h.create(&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: h.installNS, Name: name}})
	}

	cfg := h.impersonate("ironlb-cleanup")
	hook, err := client.New(cfg, client.Options{Scheme: controllers.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	// RBAC lets the hook patch any Service and the controller Deployment; the
	// chart's admission policy limits it to what Cleanup does. The policy takes
	// effect asynchronously: wait until a forbidden change (a new label value each
	// try, harmless while it is still allowed) is denied.
	var denied error
	try := 0
	h.eventually("the cleanup policy to deny a label change", func() (bool, string) {
		try++
		patch := client.RawPatch(types.MergePatchType, fmt.Appendf(nil, `{"metadata":{"labels":{"probe":"%d"}}}`, try))
		denied = hook.Patch(h.ctx, h.get("ours"), patch)
		return apierrors.IsInvalid(denied) || apierrors.IsForbidden(denied), fmt.Sprint(denied)
	})
	if !strings.Contains(denied.Error(), "the cleanup hook may only remove the annotation") {
		t.Errorf("denied with %v", denied)
	}
	for what, patch := range map[string]string{
		"change the spec":    `{"spec":{"externalTrafficPolicy":"Local"}}`,
		"change annotations": `{"metadata":{"annotations":{"other":"x"}}}`,
	} {
		if err := hook.Patch(h.ctx, h.get("ours"), client.RawPatch(types.MergePatchType, []byte(patch))); err == nil {
			t.Errorf("the cleanup hook could %s of a Service", what)
		}
	}
	depPatch := client.RawPatch(types.MergePatchType, []byte(`{"spec":{"template":{"spec":{"containers":[{"name":"controller","image":"evil"}]}}}}`))
	if err := hook.Patch(h.ctx, dep.DeepCopy(), depPatch); err == nil || !strings.Contains(err.Error(), "only scale the controller Deployment to 0") {
		t.Errorf("changing the controller's image as the cleanup hook: %v, want denied", err)
	}

	var log bytes.Buffer
	err = controllers.Cleanup(context.Background(), controllers.CleanupOptions{
		Namespace: h.installNS, DeploymentName: dep.Name,
		MemberlistSecretName: "ironlb-memberlist", WebhookSecretName: "ironlb-webhook-cert",
		Timeout: 30 * time.Second, RESTConfig: cfg, Out: &log,
	})
	if err != nil {
		t.Fatalf("cleanup as the hook's ServiceAccount: %v\n%s", err, log.String())
	}
	if got := ingress(h.get("ours")); len(got) != 0 {
		t.Errorf("ours: ingress %v after cleanup", got)
	}
}

// applyChartRBAC renders one template of the chart (bin/helm) into the harness's
// install namespace and creates its Roles, ClusterRoles, admission policies and
// their bindings, removed when the test ends. ServiceAccounts and workloads are
// not created: tests impersonate the accounts and run the code in process.
func (h *harness) applyChartRBAC(template string) {
	h.t.Helper()
	root, _ := filepath.Abs("..")
	helm := filepath.Join(root, "bin", "helm")
	if _, err := os.Stat(helm); err != nil {
		h.t.Skipf("needs %s (make bin/helm): %v", helm, err)
	}
	out, err := exec.Command(helm, "template", "ironlb", filepath.Join(root, "charts", "ironlb"), "--kube-version", "v1.37.1",
		"--namespace", h.installNS, "--show-only", template).Output()
	if err != nil {
		h.t.Fatalf("helm template: %v", err)
	}
	for _, doc := range strings.Split(string(out), "\n---") {
		var head struct {
			Kind string `json:"kind"`
		}
		if err := yaml.Unmarshal([]byte(doc), &head); err != nil {
			h.t.Fatal(err)
		}
		var obj client.Object
		switch head.Kind {
		case "ClusterRole":
			obj = &rbacv1.ClusterRole{}
		case "ClusterRoleBinding":
			obj = &rbacv1.ClusterRoleBinding{}
		case "Role":
			obj = &rbacv1.Role{}
		case "RoleBinding":
			obj = &rbacv1.RoleBinding{}
		case "ValidatingAdmissionPolicy":
			obj = &admissionregistrationv1.ValidatingAdmissionPolicy{}
		case "ValidatingAdmissionPolicyBinding":
			obj = &admissionregistrationv1.ValidatingAdmissionPolicyBinding{}
		default:
			continue
		}
		if err := yaml.Unmarshal([]byte(doc), obj); err != nil {
			h.t.Fatal(err)
		}
		h.create(obj)
		h.t.Cleanup(func() { _ = k8s.Delete(context.Background(), obj) })
	}
}

// impersonate returns the test API server's config acting as the ServiceAccount
// name of the install namespace.
func (h *harness) impersonate(name string) *rest.Config {
	cfg := rest.CopyConfig(restCfg)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: "system:serviceaccount:" + h.installNS + ":" + name}
	return cfg
}
