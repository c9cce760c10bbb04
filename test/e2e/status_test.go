//go:build e2e

package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/yaml"

	"github.com/ironlb/ironlb/internal/election"
	"github.com/ironlb/ironlb/internal/statusview"
)

// statusRun is one run of `kubectl-ironlb status`.
type statusRun struct {
	stdout, stderr string
	code           int
}

func (r statusRun) String() string {
	return fmt.Sprintf("exit %d\n%s%s", r.code, r.stdout, r.stderr)
}

// buildPlugin builds the kubectl plugin for this test.
func (e *Env) buildPlugin(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "kubectl-ironlb")
	if out, err := e.run(ctxT(t), "go", "build", "-o", bin, "./cmd/kubectl-ironlb"); err != nil {
		t.Fatalf("building kubectl-ironlb: %v\n%s", err, out)
	}
	return bin
}

// status runs the plugin's status command against the cluster as the
// lab's admin.
func (e *Env) status(t *testing.T, plugin string, args ...string) statusRun {
	t.Helper()
	return e.statusWith(t, plugin, e.Kubeconfig, args...)
}

// statusWith runs the plugin's status command with kubeconfig.
func (e *Env) statusWith(t *testing.T, plugin, kubeconfig string, args ...string) statusRun {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, plugin, append([]string{"status", "--kubeconfig", kubeconfig, "--ironlb-namespace", Namespace}, args...)...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	r := statusRun{stdout: out.String(), stderr: errb.String()}
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee):
		r.code = ee.ExitCode()
	case err != nil:
		t.Fatalf("running %s: %v", plugin, err)
	}
	return r
}

func serviceStatus(r statusview.Report, name string) (statusview.ServiceStatus, bool) {
	i := slices.IndexFunc(r.Services, func(s statusview.ServiceStatus) bool { return s.Name == name })
	if i < 0 {
		return statusview.ServiceStatus{}, false
	}
	return r.Services[i], true
}

// TestStatus runs `kubectl ironlb status` (cmd/kubectl-ironlb, pods/exec
// into every speaker) against the walkthrough: each Service's announcer is
// the node its ServiceL2Status names and the exit code is 0; a node then
// labelled exclude-from-external-load-balancers is shown with that reason;
// -o json and -o yaml parse.
func TestStatus(t *testing.T) {
	e := requireEnv(t)
	applyWalkthrough(t, e)
	var watch []string
	dumpOnFailure(t, e, func() []string { return watch })
	plugin := e.buildPlugin(t)

	want := map[string]string{}
	for _, s := range walkthroughServices {
		want["default/"+s] = e.waitAnnouncer(t, "default", s, "")
		watch = append(watch, want["default/"+s])
	}
	var last statusRun
	poll(t, 2*time.Minute, "status exits 0 and names the ServiceL2Status nodes as announcers", func() (bool, string) {
		last = e.status(t, plugin, "-o", "json")
		var r statusview.Report
		if err := json.Unmarshal([]byte(last.stdout), &r); err != nil {
			return false, fmt.Sprintf("-o json does not parse: %v\n%s", err, last)
		}
		if last.code != 0 {
			return false, last.String()
		}
		for name, node := range want {
			s, ok := serviceStatus(r, name)
			if !ok || s.Announcer != node {
				return false, fmt.Sprintf("%s: announcer %q, ServiceL2Status node %s\n%s", name, s.Announcer, node, last)
			}
			// The ServiceL2Status might have moved meanwhile: re-read it.
			if nodes, err := e.announcers(context.Background(), "default", strings.TrimPrefix(name, "default/")); err != nil || !slices.Equal(nodes, []string{node}) {
				return false, fmt.Sprintf("%s: ServiceL2Status now %v (%v)", name, nodes, err)
			}
		}
		if !r.Membership.Agree || len(r.Speakers) < 2 {
			return false, fmt.Sprintf("membership %+v, speakers %+v", r.Membership, r.Speakers)
		}
		return true, ""
	})
	table := e.status(t, plugin)
	t.Logf("kubectl ironlb status:\n%s", table)
	if table.code != 0 || !strings.Contains(table.stdout, "no problem found") {
		t.Errorf("table output: %s", table)
	}

	// Exclude a worker that does not announce svc1: svc1 stays where it is
	// and shows the label's reason for that node.
	var nodes corev1.NodeList
	if err := e.C.List(context.Background(), &nodes); err != nil {
		t.Fatal(err)
	}
	var excluded string
	for _, n := range nodes.Items {
		if _, cp := n.Labels["node-role.kubernetes.io/control-plane"]; !cp && n.Name != want["default/svc1"] {
			excluded = n.Name
			break
		}
	}
	if excluded == "" {
		t.Fatal("no worker other than svc1's announcer")
	}
	watch = append(watch, excluded)
	e.setExcludeLabel(t, excluded, true)
	t.Cleanup(func() { e.setExcludeLabel(t, excluded, false) })
	poll(t, 2*time.Minute, excluded+" shown as excluded by the label, exit 0", func() (bool, string) {
		last = e.status(t, plugin, "default/svc1", "-o", "yaml")
		var r statusview.Report
		if err := yaml.Unmarshal([]byte(last.stdout), &r); err != nil {
			return false, fmt.Sprintf("-o yaml does not parse: %v\n%s", err, last)
		}
		s, ok := serviceStatus(r, "default/svc1")
		if last.code != 0 || !ok || len(r.Services) != 1 {
			return false, last.String()
		}
		if s.Announcer != want["default/svc1"] {
			return false, fmt.Sprintf("svc1 announced by %q, want %s (unmoved)\n%s", s.Announcer, want["default/svc1"], last)
		}
		i := slices.IndexFunc(s.Nodes, func(n statusview.NodeStatus) bool { return n.Node == excluded })
		if i < 0 || s.Nodes[i].State != election.NodeExcludedByLabel || !strings.Contains(s.Nodes[i].Detail, excludeLBLabel) {
			return false, fmt.Sprintf("%s not shown as %s\n%s", excluded, election.NodeExcludedByLabel, last)
		}
		return true, ""
	})
	ip, err := e.ingressIP(context.Background(), "default", "svc1")
	if err != nil {
		t.Fatal(err)
	}
	byIP := e.status(t, plugin, ip)
	t.Logf("kubectl ironlb status %s:\n%s", ip, byIP)
	if byIP.code != 0 || !strings.Contains(byIP.stdout, excluded) || !strings.Contains(byIP.stdout, election.NodeExcludedByLabel) {
		t.Errorf("status by IP: %s", byIP)
	}

	// A user holding only the chart's status-reader role, whose exec the
	// chart's ValidatingAdmissionPolicy limits to the command the plugin
	// runs (controllers' TestStatusReaderExecLimited checks what it
	// refuses), reads the same status: the plugin and the policy agree.
	reader := e.kubeconfigAs(t, "ironlb-status-e2e")
	binding := &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Namespace: Namespace, Name: "ironlb-status-e2e"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: Release + ":status-reader"},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: "ironlb-status-e2e"}},
	}
	if err := e.C.Create(context.Background(), binding); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.C.Delete(context.Background(), binding) })
	poll(t, time.Minute, "a status-reader reads svc1's status, exit 0", func() (bool, string) {
		last = e.statusWith(t, plugin, reader, "default/svc1", "-o", "json")
		var r statusview.Report
		if err := json.Unmarshal([]byte(last.stdout), &r); err != nil || last.code != 0 {
			return false, fmt.Sprintf("%v\n%s", err, last)
		}
		s, ok := serviceStatus(r, "default/svc1")
		return ok && s.Announcer == want["default/svc1"], last.String()
	})
}

// kubeconfigAs writes a copy of the lab's kubeconfig whose user
// impersonates user (kubectl's --as), and returns its path.
func (e *Env) kubeconfigAs(t *testing.T, user string) string {
	t.Helper()
	cfg, err := clientcmd.LoadFromFile(e.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	for _, ai := range cfg.AuthInfos {
		ai.Impersonate = user
	}
	p := filepath.Join(t.TempDir(), "kubeconfig-"+user)
	if err := clientcmd.WriteToFile(*cfg, p); err != nil {
		t.Fatal(err)
	}
	return p
}
