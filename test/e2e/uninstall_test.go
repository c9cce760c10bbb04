//go:build e2e

package e2e

import (
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/ironlb/ironlb/api/v1beta1"
)

// TestUninstall: helm uninstall releases the IPs and leaves nothing of ironlb behind in the
// install namespace or cluster-wide (CRDs stay, as Helm keeps crds/). Then the
// chart is installed again, so the cluster is as the suite found it. It runs
// last (file order).
func TestUninstall(t *testing.T) {
	e := requireEnv(t)
	ips := applyWalkthrough(t, e)
	dumpOnFailure(t, e, nil)
	ctx := ctxT(t)
	reinstall := func() {
		if err := e.install(ctx); err != nil {
			t.Errorf("reinstalling: %v", err)
		}
	}
	if out, err := e.run(ctx, e.Helm, "--kubeconfig", e.Kubeconfig, "uninstall", Release, "-n", Namespace, "--wait", "--timeout", "2m"); err != nil {
		t.Fatalf("helm uninstall: %v\n%s", err, out)
	}
	reinstalled := false
	defer func() {
		if !reinstalled {
			reinstall()
		}
	}()

	poll(t, 2*time.Minute, "nothing of ironlb left", func() (bool, string) {
		var left []string
		var pods corev1.PodList
		if err := e.C.List(ctx, &pods, client.InNamespace(Namespace)); err != nil {
			return false, err.Error()
		}
		for _, p := range pods.Items {
			left = append(left, "pod/"+p.Name)
		}
		var secrets corev1.SecretList
		if err := e.C.List(ctx, &secrets, client.InNamespace(Namespace)); err != nil {
			return false, err.Error()
		}
		for _, s := range secrets.Items {
			left = append(left, "secret/"+s.Name)
		}
		var l2 v1beta1.ServiceL2StatusList
		if err := e.C.List(ctx, &l2, client.InNamespace(Namespace)); err != nil {
			return false, err.Error()
		}
		for _, s := range l2.Items {
			left = append(left, "servicel2status/"+s.Name)
		}
		out, err := e.kubectl(ctx, "", "get", "validatingwebhookconfigurations,clusterroles,clusterrolebindings", "-o", "name")
		if err != nil {
			return false, err.Error()
		}
		for _, l := range strings.Fields(out) {
			if strings.Contains(l, Release) {
				left = append(left, l)
			}
		}
		return len(left) == 0, fmt.Sprintf("left behind: %v", left)
	})

	// The chart's pre-delete hook (ironlb cleanup) released every IP.
	for _, s := range walkthroughServices {
		if ip, err := e.ingressIP(ctx, "default", s); err != nil || ip != "" {
			t.Errorf("after helm uninstall %s still has EXTERNAL-IP %q (err %v), want it released", s, ip, err)
		}
	}

	// Reinstalled, every Service gets an address of the pool again (the same
	// set: the first free ones).
	reinstalled = true
	reinstall()
	want := map[string]bool{}
	for _, ip := range ips {
		want[ip] = true
	}
	for _, s := range walkthroughServices {
		ip := e.waitIngressIP(t, "default", s)
		if !want[ip] {
			t.Errorf("after reinstalling, %s has %s, want one of %v", s, ip, ips)
		}
		delete(want, ip)
	}
}
