package controllers_test

import (
	"fmt"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
)

// statusExecPolicy is the chart's policy's name (templates/rbac.yaml, release "ironlb").
const statusExecPolicy = "ironlb-status-exec"

// exec asks the API server to exec argv in pod's container as cfg's user,
// and returns the error of the request. The Pods here never run (envtest
// has no kubelet), so a request admission lets through still fails, later
// and differently: deniedByStatusPolicy tells the two apart.
func execAs(h *harness, cfg *rest.Config, pod, container string, argv []string, tty bool) error {
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		h.t.Fatal(err)
	}
	return cs.CoreV1().RESTClient().Post().Namespace(h.installNS).Resource("pods").Name(pod).SubResource("exec").
		VersionedParams(&corev1.PodExecOptions{Container: container, Command: argv, Stdout: true, TTY: tty}, scheme.ParameterCodec).
		Do(h.ctx).Error()
}

func deniedByStatusPolicy(err error) bool {
	return err != nil && strings.Contains(err.Error(), statusExecPolicy)
}

// The chart's status-reader role execs only what `kubectl ironlb status`
// runs, in the speakers (issue 24: it used to let its holder exec anything
// in any Pod of the namespace, the controller's included), while a user who
// may create Pods there keeps exec as it was.
func TestStatusReaderExecLimited(t *testing.T) {
	h := newHarness(t)
	h.applyChartRBAC("templates/rbac.yaml")
	h.create(&rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Namespace: h.installNS, Name: "alice-ironlb-status"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "ironlb:status-reader"},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: "alice"}},
	})
	// envtest runs no controller-manager to aggregate the built-in admin
	// role: bob's is the part of it that matters here.
	h.create(&rbacv1.Role{
		ObjectMeta: metav1.ObjectMeta{Namespace: h.installNS, Name: "pod-admin"},
		Rules: []rbacv1.PolicyRule{
			{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"create", "get", "list"}},
			{APIGroups: []string{""}, Resources: []string{"pods/exec"}, Verbs: []string{"create", "get"}},
		},
	})
	h.create(&rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Namespace: h.installNS, Name: "bob-pod-admin"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "pod-admin"},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: "bob"}},
	})
	user := func(name string) *rest.Config {
		cfg := rest.CopyConfig(restCfg)
		cfg.Impersonate = rest.ImpersonationConfig{UserName: name}
		return cfg
	}
	alice, bob := user("alice"), user("bob")
	status := []string{"/ironlb", "status", "--local", "--address", "127.0.0.1:17472"}
	const speaker = "ironlb-speaker-x7k2p"

	// The policy applies once the API server has compiled it.
	h.eventually("the status-exec policy denies a shell", func() (bool, string) {
		err := execAs(h, alice, speaker, "speaker", []string{"/bin/sh"}, false)
		return deniedByStatusPolicy(err), fmt.Sprint(err)
	})
	for _, tc := range []struct {
		name      string
		cfg       *rest.Config
		pod, ctr  string
		argv      []string
		tty, deny bool
	}{
		{"status", alice, speaker, "speaker", status, false, false},
		{"status of one Service, without the segment", alice, speaker, "speaker", append(status, "--segment=false", "default/svc1"), false, false},
		{"status of one IP", alice, speaker, "speaker", append(status, "172.18.255.200"), false, false},
		{"status over IPv6 loopback", alice, speaker, "speaker", []string{"/ironlb", "status", "--local", "--address", "[::1]:17472"}, false, false},
		{"a shell", alice, speaker, "speaker", []string{"/bin/sh", "-c", "cat /etc/ml_secret_key/secretkey"}, false, true},
		{"the status command in a controller Pod", alice, "ironlb-controller-5c9bb48c8f-j4hl6", "controller", status, false, true},
		{"another container", alice, speaker, "debug", status, false, true},
		{"the status fetched from another host", alice, speaker, "speaker", []string{"/ironlb", "status", "--local", "--address", "10.96.0.1:443"}, false, true},
		{"another subcommand", alice, speaker, "speaker", []string{"/ironlb", "cleanup", "--local", "--address", "127.0.0.1:17472"}, false, true},
		{"an extra flag", alice, speaker, "speaker", append(status, "--kubeconfig=/x"), false, true},
		{"a terminal", alice, speaker, "speaker", status, true, true},
		{"a shell, by a user who may create Pods", bob, speaker, "speaker", []string{"/bin/sh"}, false, false},
	} {
		err := execAs(h, tc.cfg, tc.pod, tc.ctr, tc.argv, tc.tty)
		if !tc.deny && (err == nil || !apierrors.IsNotFound(err)) {
			// Admitted, it reaches the Pod, which does not exist.
			t.Errorf("%s: want the Pod not found once admitted, got %v", tc.name, err)
		}
		if got := deniedByStatusPolicy(err); got != tc.deny {
			t.Errorf("%s: denied by %s = %v, want %v (error: %v)", tc.name, statusExecPolicy, got, tc.deny, err)
		}
	}
}
