package statuscmd

import (
	"bytes"
	"compress/gzip"
	"encoding/base64"
	"encoding/json"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ironlb/ironlb/internal/statusview"
)

func deployment(name string, labels map[string]string) appsv1.Deployment {
	return appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels},
		Spec: appsv1.DeploymentSpec{Selector: &metav1.LabelSelector{MatchLabels: labels}}}
}

func daemonSet(name string, labels map[string]string, c ...corev1.Container) appsv1.DaemonSet {
	ds := appsv1.DaemonSet{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels},
		Spec: appsv1.DaemonSetSpec{Selector: &metav1.LabelSelector{MatchLabels: labels}}}
	ds.Spec.Template.Spec.Containers = c
	return ds
}

func TestDetectMetalLB(t *testing.T) {
	native := func(c string) map[string]string { return map[string]string{"app": "metallb", "component": c} }
	helm := func(c string) map[string]string {
		return map[string]string{"app.kubernetes.io/name": "metallb", "app.kubernetes.io/component": c}
	}
	ironlb := map[string]string{"app.kubernetes.io/name": "ironlb", "app.kubernetes.io/component": "speaker"}
	hd := deployment("metallb-controller", helm("controller"))
	hd.Annotations = map[string]string{"meta.helm.sh/release-name": "metallb"}
	for _, c := range []struct {
		name    string
		deps    []appsv1.Deployment
		dss     []appsv1.DaemonSet
		want    *metallbInstall
		missing string
	}{
		{"manifests", []appsv1.Deployment{deployment("controller", native("controller"))},
			[]appsv1.DaemonSet{daemonSet("speaker", native("speaker")), daemonSet("ironlb-speaker", ironlb)},
			&metallbInstall{Controller: "controller", Replicas: 1, ControllerSelector: native("controller"), Speaker: "speaker", SpeakerSelector: native("speaker")}, ""},
		{"helm", []appsv1.Deployment{hd}, []appsv1.DaemonSet{daemonSet("metallb-speaker", helm("speaker"))},
			&metallbInstall{Controller: "metallb-controller", Replicas: 1, ControllerSelector: helm("controller"), Speaker: "metallb-speaker", SpeakerSelector: helm("speaker"), HelmRelease: "metallb"}, ""},
		{"none", nil, []appsv1.DaemonSet{daemonSet("ironlb-speaker", ironlb)}, nil, "no MetalLB controller Deployment or speaker DaemonSet"},
		{"no speaker", []appsv1.Deployment{deployment("controller", native("controller"))}, nil, nil, "controller Deployment controller is there but no speaker DaemonSet"},
		{"no controller", nil, []appsv1.DaemonSet{daemonSet("speaker", native("speaker"))}, nil, "speaker DaemonSet speaker is there but no controller Deployment"},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, missing := detectMetalLB(c.deps, c.dss)
			if !strings.Contains(missing, c.missing) || (c.missing == "") != (missing == "") {
				t.Errorf("missing %q, want %q", missing, c.missing)
			}
			switch {
			case (got == nil) != (c.want == nil):
				t.Fatalf("got %+v, want %+v", got, c.want)
			case got != nil && (got.Controller != c.want.Controller || got.Speaker != c.want.Speaker || got.Replicas != c.want.Replicas ||
				got.HelmRelease != c.want.HelmRelease || !mapsEqual(got.SpeakerSelector, c.want.SpeakerSelector) ||
				!mapsEqual(got.ControllerSelector, c.want.ControllerSelector)):
				t.Errorf("got %+v, want %+v", got, c.want)
			}
		})
	}
}

func mapsEqual(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

func TestMigrationRefusals(t *testing.T) {
	speaker := corev1.Container{Name: "speaker", Args: []string{"--port=9120"}}
	for _, c := range []struct {
		name    string
		ds      appsv1.DaemonSet
		peers   []string
		ads     []string
		refuses []string
	}{
		{"layer 2 only", daemonSet("speaker", nil, speaker), nil, nil, nil},
		{"native BGP type is not FRR", daemonSet("speaker", nil, corev1.Container{Name: "speaker", Env: []corev1.EnvVar{{Name: "METALLB_BGP_TYPE", Value: "native"}}}), nil, nil, nil},
		{"the frr-k8s backend without BGP objects", daemonSet("speaker", nil, corev1.Container{Name: "speaker", Env: []corev1.EnvVar{{Name: "METALLB_BGP_TYPE", Value: "frr-k8s"}}}), nil, nil, nil},
		{"FRR container", daemonSet("speaker", nil, speaker, corev1.Container{Name: "frr"}), nil, nil, []string{"FRR mode: DaemonSet speaker runs an frr container"}},
		{"FRR env", daemonSet("speaker", nil, corev1.Container{Name: "speaker", Env: []corev1.EnvVar{{Name: "METALLB_BGP_TYPE", Value: "frr"}}}), nil, nil, []string{"METALLB_BGP_TYPE=frr"}},
		{"FRR flag", daemonSet("speaker", nil, corev1.Container{Name: "speaker", Args: []string{"--bgp-type=frr"}}), nil, nil, []string{"--bgp-type=frr"}},
		{"frr-k8s with BGP objects", daemonSet("speaker", nil, corev1.Container{Name: "speaker", Args: []string{"--bgp-type=frr-k8s"}}), []string{"router"}, nil, []string{"BGPPeers (router)"}},
		{"BGP objects", daemonSet("speaker", nil, speaker), []string{"router"}, []string{"ads"}, []string{"BGPPeers (router)", "BGPAdvertisements (ads)"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			got := migrationRefusals(frrMode(&c.ds), c.peers, c.ads)
			if len(got) != len(c.refuses) {
				t.Fatalf("refusals %q, want %d containing %q", got, len(c.refuses), c.refuses)
			}
			for i, w := range c.refuses {
				if !strings.Contains(got[i], w) || !strings.Contains(got[i], "ironlb has no BGP") {
					t.Errorf("refusal %q, want it to contain %q and say why", got[i], w)
				}
			}
		})
	}
}

func lbService(ns, name string, ips ...string) corev1.Service {
	s := corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer}}
	for _, ip := range ips {
		s.Status.LoadBalancer.Ingress = append(s.Status.LoadBalancer.Ingress, corev1.LoadBalancerIngress{IP: ip})
	}
	return s
}

func TestServedServicesAndChecks(t *testing.T) {
	cluster := corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "cip"}}
	before := servedServices([]corev1.Service{lbService("default", "svc2", "10.0.0.2"), cluster, lbService("default", "pending"),
		lbService("default", "svc1", "10.0.0.1", "fd00::1")},
		[]l2Status{{node: "w1", service: "default/svc1"}, {node: "", service: "default/svc2"}})
	want := []migratedService{{Name: "default/svc1", IPs: []string{"10.0.0.1", "fd00::1"}, Announcer: "w1"}, {Name: "default/svc2", IPs: []string{"10.0.0.2"}}}
	if !slices.EqualFunc(before, want, func(a, b migratedService) bool {
		return a.Name == b.Name && slices.Equal(a.IPs, b.IPs) && a.Announcer == b.Announcer
	}) {
		t.Fatalf("servedServices = %+v, want %+v", before, want)
	}

	t.Run("ipChanges", func(t *testing.T) {
		same := servedServices([]corev1.Service{lbService("default", "svc1", "fd00::1", "10.0.0.1"), lbService("default", "svc2", "10.0.0.2")}, nil)
		if got := ipChanges(before, same); len(got) != 0 {
			t.Errorf("same IPs in another order: %q", got)
		}
		moved := servedServices([]corev1.Service{lbService("default", "svc1", "10.0.0.1", "fd00::1"), lbService("default", "svc2", "10.0.0.9")}, nil)
		if got := ipChanges(before, moved); len(got) != 1 || got[0] != "default/svc2: 10.0.0.2 before, 10.0.0.9 now" {
			t.Errorf("changed: %q", got)
		}
		if got := ipChanges(before, moved[:1]); len(got) != 1 || !strings.Contains(got[0], "none now") {
			t.Errorf("stripped: %q", got)
		}
	})

	t.Run("announcerMismatches", func(t *testing.T) {
		r := statusview.Report{Services: []statusview.ServiceStatus{{Name: "default/svc1", Announcer: "w1"}, {Name: "default/svc2", Announcer: "w3"}}}
		if got := announcerMismatches(before, r); len(got) != 0 {
			t.Errorf("taken over: %q", got)
		}
		r.Services[0].Announcer = "w2"
		r.Services[1].Announcer = ""
		got := announcerMismatches(before, r)
		if len(got) != 2 || got[0] != "default/svc1: MetalLB announced it from w1, ironlb from w2" || got[1] != "default/svc2: ironlb does not announce it yet" {
			t.Errorf("mismatches: %q", got)
		}
		if got := announcerMismatches(before, statusview.Report{}); len(got) != 2 || !strings.Contains(got[0], "not known") {
			t.Errorf("unknown: %q", got)
		}
	})
}

func TestHelmInstallCommand(t *testing.T) {
	got := helmInstallCommand("ironlb", "charts/ironlb", "metallb-system")
	want := "helm install ironlb charts/ironlb -n metallb-system --wait --set speaker.memberlist.mlBindPort=7947 --set speaker.healthProbePort=17473 --set prometheus.metricsPort=9122"
	if got != want {
		t.Errorf("got  %s\nwant %s", got, want)
	}
}

// helmRecord encodes a release manifest as Helm 3 stores it in its Secret:
// base64 of gzipped JSON.
func helmRecord(t *testing.T, manifest string) []byte {
	t.Helper()
	js, err := json.Marshal(map[string]any{"name": "metallb", "manifest": manifest, "version": 1})
	if err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	zw := gzip.NewWriter(&b)
	if _, err := zw.Write(js); err != nil {
		t.Fatal(err)
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return []byte(base64.StdEncoding.EncodeToString(b.Bytes()))
}

func TestHelmReleaseObjects(t *testing.T) {
	manifest := `---
# Source: metallb/charts/crds/templates/crds.yaml
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: ipaddresspools.metallb.io
---
# Source: metallb/templates/rbac.yaml
apiVersion: v1
kind: ServiceAccount
metadata:
  name: metallb-controller
  namespace: "metallb-system"
---
# Source: metallb/templates/speaker.yaml
apiVersion: apps/v1
kind: DaemonSet
metadata:
  name: metallb-speaker
---
# an empty document
---
apiVersion: v1
kind: Namespace
metadata:
  name: metallb-system
`
	got, err := helmReleaseManifest(helmRecord(t, manifest))
	if err != nil {
		t.Fatal(err)
	}
	if got != manifest {
		t.Fatalf("manifest decoded as %q", got)
	}
	objs, err := releaseObjects(got)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, o := range objs {
		names = append(names, o.GetKind()+"/"+o.GetName())
	}
	if want := []string{"ServiceAccount/metallb-controller", "DaemonSet/metallb-speaker"}; !slices.Equal(names, want) {
		t.Errorf("objects %v, want %v (the CRD and the Namespace stay)", names, want)
	}
	if _, err := helmReleaseManifest([]byte("not base64!")); err == nil {
		t.Error("a record that is not base64 decodes")
	}
}
