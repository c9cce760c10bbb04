// Package chart tests the Helm chart against what the Go code declares it needs.
package chart

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"

	rbacv1 "k8s.io/api/rbac/v1"
	"sigs.k8s.io/yaml"
)

// The namespace the markers use for "the install namespace" (namespace= in
// +kubebuilder:rbac), and the one the chart is rendered into here. They differ on
// purpose: a Role of the markers must be granted in whatever namespace the chart
// is installed into.
const (
	markerNamespace  = "metallb-system"
	releaseNamespace = "ilb-rbac-test"
	kubeVersion      = "v1.37.1"
)

// knownDrift lists marker permissions the chart deliberately does not grant yet,
// with the reason (none today). The test logs them instead of failing, and fails on
// an entry that is no longer needed.
var knownDrift = map[string]string{}

// TestChartGrantsMarkerRBAC checks that the chart's RBAC for the controller and the
// speaker grants every rule controller-gen generates from the +kubebuilder:rbac
// markers (config/rbac, `make manifests`), so the code and the chart cannot drift
// apart. A chart rule limited by resourceNames counts as a grant: the markers
// cannot name objects, the chart narrows them.
func TestChartGrantsMarkerRBAC(t *testing.T) {
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	helm := filepath.Join(root, "bin", "helm")
	if _, err := os.Stat(helm); err != nil {
		t.Skipf("needs %s (make bin/helm): %v", helm, err)
	}
	cmd := exec.Command(helm, "template", "ironlb", filepath.Join(root, "charts", "ironlb"),
		"--kube-version", kubeVersion, "--namespace", releaseNamespace)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	rendered, err := cmd.Output()
	if err != nil {
		t.Fatalf("helm template: %v\n%s", err, stderr.String())
	}
	chart := parseDocs(t, rendered)

	used := map[string]bool{}
	for _, c := range []struct{ component, sa string }{
		{"controller", "ironlb-controller"},
		{"speaker", "ironlb-speaker"},
	} {
		gen, err := os.ReadFile(filepath.Join(root, "config", "rbac", c.component, "role.yaml"))
		if err != nil {
			t.Fatalf("reading the generated RBAC (run make manifests): %v", err)
		}
		want := parseDocs(t, gen)
		granted := chart.grantsFor(c.sa, releaseNamespace)
		var missing []string
		for _, p := range want.wanted() {
			if granted(p) {
				continue
			}
			key := c.component + ": " + p.String()
			if why, ok := knownDrift[key]; ok {
				used[key] = true
				t.Logf("known drift, not granted by the chart: %s (%s)", key, why)
				continue
			}
			missing = append(missing, p.String())
		}
		if len(missing) > 0 {
			t.Errorf("the chart does not grant the %s (ServiceAccount %s) these permissions its markers ask for:\n  %s\n"+
				"grant them in charts/ironlb/templates/rbac.yaml or change the +kubebuilder:rbac markers",
				c.component, c.sa, strings.Join(missing, "\n  "))
		}
	}
	for key := range knownDrift {
		if !used[key] {
			t.Errorf("knownDrift entry %q is no longer needed (the chart grants it or no marker asks for it): remove it", key)
		}
	}
}

// perm is one verb on one resource, cluster-wide (namespace "") or in a namespace.
type perm struct {
	namespace, group, resource, verb string
}

func (p perm) String() string {
	where := "cluster"
	if p.namespace != "" {
		where = "namespace " + p.namespace
	}
	return fmt.Sprintf("%s: %s/%s %s", where, p.group, p.resource, p.verb)
}

type objects struct {
	clusterRoles        map[string][]rbacv1.PolicyRule
	roles               map[string][]rbacv1.PolicyRule // namespace/name
	clusterRoleBindings []rbacv1.ClusterRoleBinding
	roleBindings        []rbacv1.RoleBinding
}

func parseDocs(t *testing.T, data []byte) *objects {
	t.Helper()
	o := &objects{clusterRoles: map[string][]rbacv1.PolicyRule{}, roles: map[string][]rbacv1.PolicyRule{}}
	for _, doc := range strings.Split(string(data), "\n---") {
		var head struct {
			Kind string `json:"kind"`
		}
		if err := yaml.Unmarshal([]byte(doc), &head); err != nil {
			t.Fatalf("parsing a YAML document: %v\n%s", err, doc)
		}
		var err error
		switch head.Kind {
		case "ClusterRole":
			var r rbacv1.ClusterRole
			err = yaml.Unmarshal([]byte(doc), &r)
			o.clusterRoles[r.Name] = r.Rules
		case "Role":
			var r rbacv1.Role
			err = yaml.Unmarshal([]byte(doc), &r)
			o.roles[r.Namespace+"/"+r.Name] = r.Rules
		case "ClusterRoleBinding":
			var b rbacv1.ClusterRoleBinding
			err = yaml.Unmarshal([]byte(doc), &b)
			o.clusterRoleBindings = append(o.clusterRoleBindings, b)
		case "RoleBinding":
			var b rbacv1.RoleBinding
			err = yaml.Unmarshal([]byte(doc), &b)
			o.roleBindings = append(o.roleBindings, b)
		}
		if err != nil {
			t.Fatalf("parsing a %s: %v", head.Kind, err)
		}
	}
	return o
}

// wanted expands the generated roles into single permissions; a Role in the
// markers' namespace means the release namespace.
func (o *objects) wanted() []perm {
	var out []perm
	add := func(ns string, rules []rbacv1.PolicyRule) {
		for _, r := range rules {
			for _, g := range r.APIGroups {
				for _, res := range r.Resources {
					for _, v := range r.Verbs {
						out = append(out, perm{ns, g, res, v})
					}
				}
			}
		}
	}
	for _, rules := range o.clusterRoles {
		add("", rules)
	}
	for key, rules := range o.roles {
		ns, _, _ := strings.Cut(key, "/")
		if ns == markerNamespace {
			ns = releaseNamespace
		}
		add(ns, rules)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].String() < out[j].String() })
	return out
}

// grantsFor returns whether the ServiceAccount ns/sa holds a permission through the
// chart's bindings.
func (o *objects) grantsFor(sa, ns string) func(perm) bool {
	isSA := func(subjects []rbacv1.Subject) bool {
		return slices.ContainsFunc(subjects, func(s rbacv1.Subject) bool {
			return s.Kind == rbacv1.ServiceAccountKind && s.Name == sa && s.Namespace == ns
		})
	}
	var cluster []rbacv1.PolicyRule                // everywhere
	namespaced := map[string][]rbacv1.PolicyRule{} // by namespace
	for _, b := range o.clusterRoleBindings {
		if isSA(b.Subjects) && b.RoleRef.Kind == "ClusterRole" {
			cluster = append(cluster, o.clusterRoles[b.RoleRef.Name]...)
		}
	}
	for _, b := range o.roleBindings {
		if !isSA(b.Subjects) {
			continue
		}
		switch b.RoleRef.Kind {
		case "Role":
			namespaced[b.Namespace] = append(namespaced[b.Namespace], o.roles[b.Namespace+"/"+b.RoleRef.Name]...)
		case "ClusterRole":
			namespaced[b.Namespace] = append(namespaced[b.Namespace], o.clusterRoles[b.RoleRef.Name]...)
		}
	}
	covers := func(rules []rbacv1.PolicyRule, p perm) bool {
		return slices.ContainsFunc(rules, func(r rbacv1.PolicyRule) bool {
			return has(r.APIGroups, p.group) && has(r.Resources, p.resource) && has(r.Verbs, p.verb)
		})
	}
	return func(p perm) bool {
		if covers(cluster, p) {
			return true
		}
		return p.namespace != "" && covers(namespaced[p.namespace], p)
	}
}

func has(list []string, s string) bool {
	return slices.Contains(list, s) || slices.Contains(list, "*")
}

// TestChartCleanupHookRBAC checks that the cleanup hook's ServiceAccount may do what
// controllers.Cleanup does (listed in controllers/cleanup.go; no markers, as they
// would widen the controller's role).
func TestChartCleanupHookRBAC(t *testing.T) {
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	helm := filepath.Join(root, "bin", "helm")
	if _, err := os.Stat(helm); err != nil {
		t.Skipf("needs %s (make bin/helm): %v", helm, err)
	}
	out, err := exec.Command(helm, "template", "ironlb", filepath.Join(root, "charts", "ironlb"),
		"--kube-version", kubeVersion, "--namespace", releaseNamespace).Output()
	if err != nil {
		t.Fatalf("helm template: %v", err)
	}
	granted := parseDocs(t, out).grantsFor("ironlb-cleanup", releaseNamespace)
	for _, p := range []perm{
		{"", "", "services", "list"},
		{"", "", "services", "patch"},
		{"", "", "services/status", "patch"},
		{releaseNamespace, "apps", "deployments", "get"},
		{releaseNamespace, "apps", "deployments", "patch"},
		{releaseNamespace, "", "pods", "list"},
		{releaseNamespace, "", "secrets", "delete"},
		{releaseNamespace, "metallb.io", "servicel2statuses", "list"},
		{releaseNamespace, "metallb.io", "servicel2statuses", "delete"},
	} {
		if !granted(p) {
			t.Errorf("the cleanup hook's ServiceAccount lacks %s", p)
		}
	}
}
