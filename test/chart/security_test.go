package chart

import (
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"sigs.k8s.io/yaml"
)

// render runs bin/helm template with the chart's defaults plus args.
func render(t *testing.T, args ...string) []byte {
	t.Helper()
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	helm := filepath.Join(root, "bin", "helm")
	if _, err := os.Stat(helm); err != nil {
		t.Skipf("needs %s (make bin/helm): %v", helm, err)
	}
	out, err := exec.Command(helm, append([]string{"template", "ironlb", filepath.Join(root, "charts", "ironlb"),
		"--kube-version", kubeVersion, "--namespace", releaseNamespace}, args...)...).Output()
	if err != nil {
		t.Fatalf("helm template: %v", err)
	}
	return out
}

// podSpecs returns the pod templates of the chart's workloads by "Kind/name".
func podSpecs(t *testing.T, rendered []byte) map[string]corev1.PodSpec {
	t.Helper()
	out := map[string]corev1.PodSpec{}
	for _, doc := range strings.Split(string(rendered), "\n---") {
		var head struct {
			Kind     string `json:"kind"`
			Metadata struct {
				Name string `json:"name"`
			} `json:"metadata"`
		}
		if err := yaml.Unmarshal([]byte(doc), &head); err != nil {
			t.Fatal(err)
		}
		key := head.Kind + "/" + head.Metadata.Name
		switch head.Kind {
		case "Deployment":
			var d appsv1.Deployment
			mustUnmarshal(t, doc, &d)
			out[key] = d.Spec.Template.Spec
		case "DaemonSet":
			var d appsv1.DaemonSet
			mustUnmarshal(t, doc, &d)
			out[key] = d.Spec.Template.Spec
		case "Job":
			var j batchv1.Job
			mustUnmarshal(t, doc, &j)
			out[key] = j.Spec.Template.Spec
		}
	}
	return out
}

func mustUnmarshal(t *testing.T, doc string, into any) {
	t.Helper()
	if err := yaml.Unmarshal([]byte(doc), into); err != nil {
		t.Fatal(err)
	}
}

// Every container of the chart runs under the RuntimeDefault seccomp profile, cannot
// gain privileges, has a read-only root filesystem and drops every capability; only
// the speaker adds some (NET_RAW; NET_ADMIN for planned moves' second chance, not
// with drainTimeout 0s), and only the speaker runs as root. The speaker's probes use
// 127.0.0.1, where its health endpoint listens by default.
func TestChartSecurityContexts(t *testing.T) {
	t.Run("default", func(t *testing.T) { checkSecurityContexts(t, render(t), []corev1.Capability{"NET_RAW", "NET_ADMIN"}) })
	t.Run("no second chance", func(t *testing.T) {
		checkSecurityContexts(t, render(t, "--set", "speaker.ownership.drainTimeout=0s"), []corev1.Capability{"NET_RAW"})
	})
}

func checkSecurityContexts(t *testing.T, rendered []byte, speakerAdds []corev1.Capability) {
	pods := podSpecs(t, rendered)
	for _, name := range []string{"Deployment/ironlb-controller", "DaemonSet/ironlb-speaker", "Job/ironlb-cleanup"} {
		if _, ok := pods[name]; !ok {
			t.Fatalf("the chart renders no %s (got %v)", name, slices.Collect(maps.Keys(pods)))
		}
	}
	for name, pod := range pods {
		for _, c := range pod.Containers {
			sc := c.SecurityContext
			switch {
			case sc == nil:
				t.Errorf("%s/%s: no securityContext", name, c.Name)
				continue
			case sc.SeccompProfile == nil || sc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault:
				t.Errorf("%s/%s: seccompProfile %+v, want RuntimeDefault", name, c.Name, sc.SeccompProfile)
			case sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation:
				t.Errorf("%s/%s: allowPrivilegeEscalation is not false", name, c.Name)
			case sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem:
				t.Errorf("%s/%s: root filesystem is writable", name, c.Name)
			case sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}):
				t.Errorf("%s/%s: capabilities %+v, want drop [ALL]", name, c.Name, sc.Capabilities)
			}
			wantAdd := []corev1.Capability(nil)
			if name == "DaemonSet/ironlb-speaker" {
				wantAdd = speakerAdds
				for _, a := range c.Args {
					if strings.HasPrefix(a, "--health-probe-host=") && a != "--health-probe-host=127.0.0.1" {
						t.Errorf("speaker: %s exposes the health endpoint beyond loopback", a)
					}
				}
				for _, p := range []*corev1.Probe{c.LivenessProbe, c.ReadinessProbe} {
					if p != nil && (p.HTTPGet == nil || p.HTTPGet.Host != "127.0.0.1") {
						t.Errorf("speaker: probe %+v does not use 127.0.0.1", p.ProbeHandler)
					}
				}
			} else if psc := pod.SecurityContext; psc == nil || psc.RunAsNonRoot == nil || !*psc.RunAsNonRoot {
				t.Errorf("%s: runAsNonRoot is not set", name)
			}
			if sc.Capabilities != nil && !slices.Equal(sc.Capabilities.Add, wantAdd) {
				t.Errorf("%s/%s: adds capabilities %v, want %v", name, c.Name, sc.Capabilities.Add, wantAdd)
			}
		}
	}
}

// The controller may touch only its own Secrets and its own webhook configuration:
// every rule on those carries resourceNames, except create, which RBAC cannot
// narrow. The cleanup hook's rules are limited the same way, and each of its
// objects is removed after the hook, whether it failed or not.
func TestChartNarrowRBAC(t *testing.T) {
	rendered := render(t)
	docs := parseDocs(t, rendered)
	check := func(owner string, rules []rbacv1.PolicyRule, resource string, names ...string) {
		for _, r := range rules {
			if !slices.Contains(r.Resources, resource) {
				continue
			}
			if slices.Equal(r.Verbs, []string{"create"}) {
				continue
			}
			slices.Sort(r.ResourceNames)
			if !slices.Equal(r.ResourceNames, names) {
				t.Errorf("%s: rule %v on %s has resourceNames %v, want %v", owner, r.Verbs, resource, r.ResourceNames, names)
			}
		}
	}
	role := docs.roles[releaseNamespace+"/ironlb-controller"]
	if role == nil {
		t.Fatal("no Role ironlb-controller")
	}
	check("Role ironlb-controller", role, "secrets", "ironlb-memberlist", "ironlb-webhook-cert")
	check("ClusterRole ironlb:controller", docs.clusterRoles["ironlb:controller"], "validatingwebhookconfigurations", "ironlb-webhook-configuration")
	check("Role ironlb-cleanup", docs.roles[releaseNamespace+"/ironlb-cleanup"], "deployments", "ironlb-controller")
	check("Role ironlb-cleanup", docs.roles[releaseNamespace+"/ironlb-cleanup"], "secrets", "ironlb-memberlist", "ironlb-webhook-cert")

	hooks := 0
	for _, doc := range strings.Split(string(rendered), "\n---") {
		var head struct {
			Kind     string `json:"kind"`
			Metadata struct {
				Name        string            `json:"name"`
				Annotations map[string]string `json:"annotations"`
			} `json:"metadata"`
		}
		mustUnmarshal(t, doc, &head)
		if head.Metadata.Annotations["helm.sh/hook"] == "" {
			continue
		}
		hooks++
		policy := strings.Split(head.Metadata.Annotations["helm.sh/hook-delete-policy"], ",")
		for _, want := range []string{"hook-succeeded", "hook-failed"} {
			if !slices.Contains(policy, want) {
				t.Errorf("hook %s %s is not deleted on %s (policy %v)", head.Kind, head.Metadata.Name, want, policy)
			}
		}
	}
	if hooks < 7 { // ServiceAccount, ClusterRole(+Binding), Role(+Binding), policy(+binding), Job
		t.Errorf("only %d hook objects rendered", hooks)
	}
}
