package statuscmd

import (
	"fmt"
	"slices"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"

	"github.com/ironlb/ironlb/internal/statusview"
)

// The migration from MetalLB (kubectl ironlb migrate-from-metallb) in pure
// functions: what a cluster's objects say about the MetalLB install, why a
// migration must be refused, and whether ironlb has taken over every IP
// where MetalLB announced it. migrate.go reads the cluster and acts.

// migrationConfigMap is where prepare records what it found and changed,
// for finish and abort; it lives in the install namespace.
const migrationConfigMap = "ironlb-migration"

// migrationValues are the Helm values ironlb needs while MetalLB's speakers
// still run: both speakers use the host network, and MetalLB holds 7946
// (memberlist), 9120 (metrics) and 17472 (health probes) on every node.
// They stay after the migration: changing a port later would split a
// rolling restart into two memberlist clusters.
var migrationValues = []string{
	"speaker.memberlist.mlBindPort=7947",
	"speaker.healthProbePort=17473",
	"prometheus.metricsPort=9122",
}

// metallbInstall is a MetalLB install as the namespace's workloads show it.
type metallbInstall struct {
	Controller string `json:"controller"`
	// Replicas is the controller's replica count before prepare scaled it
	// to 0 (abort restores it).
	Replicas           int32             `json:"replicas"`
	ControllerSelector map[string]string `json:"controllerSelector"`
	Speaker            string            `json:"speaker"`
	SpeakerSelector    map[string]string `json:"speakerSelector"`
	// HelmRelease names the Helm release it came from ("" for the
	// manifests).
	HelmRelease string `json:"helmRelease,omitempty"`
}

// migratedService is one Service MetalLB served: its IPs and the node that
// announced them (its ServiceL2Status; "" when there was none).
type migratedService struct {
	Name      string   `json:"name"` // namespace/name
	IPs       []string `json:"ips"`
	Announcer string   `json:"announcer,omitempty"`
}

// migrationState is what prepare records (migrationConfigMap).
type migrationState struct {
	MetalLB  metallbInstall    `json:"metallb"`
	Services []migratedService `json:"services"`
	// WebhookPolicies: the failurePolicy of each MetalLB webhook before
	// prepare set it to Ignore ("configuration/webhook" -> policy).
	WebhookPolicies map[string]string `json:"webhookPolicies,omitempty"`
}

// isMetalLB reports whether labels mark a MetalLB component: the manifests'
// app/component labels or the Helm chart's app.kubernetes.io ones.
func isMetalLB(labels map[string]string, component string) bool {
	return (labels["app"] == "metallb" && labels["component"] == component) ||
		(labels["app.kubernetes.io/name"] == "metallb" && labels["app.kubernetes.io/component"] == component)
}

// detectMetalLB finds MetalLB's controller Deployment and speaker DaemonSet
// among a namespace's workloads. It returns nil and why when there is no
// complete MetalLB install.
func detectMetalLB(deps []appsv1.Deployment, dss []appsv1.DaemonSet) (*metallbInstall, string) {
	var in metallbInstall
	for i := range deps {
		if d := &deps[i]; isMetalLB(d.Labels, "controller") {
			in.Controller, in.ControllerSelector = d.Name, d.Spec.Selector.MatchLabels
			in.Replicas = 1
			if d.Spec.Replicas != nil {
				in.Replicas = *d.Spec.Replicas
			}
			in.HelmRelease = d.Annotations["meta.helm.sh/release-name"]
		}
	}
	for i := range dss {
		if d := &dss[i]; isMetalLB(d.Labels, "speaker") {
			in.Speaker, in.SpeakerSelector = d.Name, d.Spec.Selector.MatchLabels
		}
	}
	switch {
	case in.Controller == "" && in.Speaker == "":
		return nil, "no MetalLB controller Deployment or speaker DaemonSet (labels app=metallb or app.kubernetes.io/name=metallb)"
	case in.Speaker == "":
		return nil, fmt.Sprintf("MetalLB's controller Deployment %s is there but no speaker DaemonSet", in.Controller)
	case in.Controller == "":
		return nil, fmt.Sprintf("MetalLB's speaker DaemonSet %s is there but no controller Deployment", in.Speaker)
	}
	return &in, ""
}

// frrMode says why a MetalLB speaker DaemonSet runs BGP through FRR ("" when
// it does not): its frr container, or METALLB_BGP_TYPE or --bgp-type frr. The
// frr-k8s backend (the Helm chart's default) is not FRR mode: without BGP
// objects it announces nothing, and layer 2 works without it.
func frrMode(ds *appsv1.DaemonSet) string {
	for _, c := range ds.Spec.Template.Spec.Containers {
		if c.Name == "frr" {
			return fmt.Sprintf("DaemonSet %s runs an frr container", ds.Name)
		}
		for _, e := range c.Env {
			if e.Name == "METALLB_BGP_TYPE" && e.Value == "frr" {
				return fmt.Sprintf("DaemonSet %s sets METALLB_BGP_TYPE=frr", ds.Name)
			}
		}
		if slices.Contains(c.Args, "--bgp-type=frr") {
			return fmt.Sprintf("DaemonSet %s runs with --bgp-type=frr", ds.Name)
		}
	}
	return ""
}

// migrationRefusals lists why a cluster cannot migrate: ironlb has no BGP,
// so a MetalLB that peers over BGP or runs FRR cannot be replaced.
func migrationRefusals(frr string, bgpPeers, bgpAdvertisements []string) []string {
	var out []string
	if frr != "" {
		out = append(out, "MetalLB runs in FRR mode: "+frr+"; ironlb has no BGP")
	}
	if len(bgpPeers) > 0 {
		out = append(out, fmt.Sprintf("MetalLB has BGPPeers (%s); ironlb has no BGP", strings.Join(bgpPeers, ", ")))
	}
	if len(bgpAdvertisements) > 0 {
		out = append(out, fmt.Sprintf("MetalLB has BGPAdvertisements (%s); ironlb has no BGP", strings.Join(bgpAdvertisements, ", ")))
	}
	return out
}

// servedServices returns the LoadBalancer Services that show IPs, with the
// node each ServiceL2Status names, sorted by name.
func servedServices(svcs []corev1.Service, statuses []l2Status) []migratedService {
	announcer := map[string]string{}
	for _, st := range statuses {
		if st.node != "" {
			announcer[st.service] = st.node
		}
	}
	var out []migratedService
	for _, s := range svcs {
		if s.Spec.Type != corev1.ServiceTypeLoadBalancer {
			continue
		}
		var ips []string
		for _, in := range s.Status.LoadBalancer.Ingress {
			if in.IP != "" {
				ips = append(ips, in.IP)
			}
		}
		if len(ips) == 0 {
			continue
		}
		name := s.Namespace + "/" + s.Name
		out = append(out, migratedService{Name: name, IPs: ips, Announcer: announcer[name]})
	}
	slices.SortFunc(out, func(a, b migratedService) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// ipChanges lists the recorded Services whose IPs are no longer the ones
// they show now (want: recorded; now: servedServices of the cluster now).
func ipChanges(want, now []migratedService) []string {
	cur := map[string][]string{}
	for _, s := range now {
		cur[s.Name] = s.IPs
	}
	var out []string
	for _, s := range want {
		if got := cur[s.Name]; !slices.Equal(slices.Sorted(slices.Values(got)), slices.Sorted(slices.Values(s.IPs))) {
			out = append(out, fmt.Sprintf("%s: %s before, %s now", s.Name, strings.Join(s.IPs, ","), orNone(strings.Join(got, ","))))
		}
	}
	return out
}

// announcerMismatches lists the recorded Services that ironlb's speakers do
// not announce from the node MetalLB announced them from (r: `kubectl
// ironlb status` of the ironlb speakers).
func announcerMismatches(want []migratedService, r statusview.Report) []string {
	got := map[string]string{}
	for _, s := range r.Services {
		got[s.Name] = s.Announcer
	}
	var out []string
	for _, s := range want {
		a, ok := got[s.Name]
		switch {
		case !ok:
			out = append(out, fmt.Sprintf("%s: not known to ironlb's speakers yet", s.Name))
		case s.Announcer != "" && a != s.Announcer:
			out = append(out, fmt.Sprintf("%s: MetalLB announced it from %s, ironlb from %s", s.Name, s.Announcer, orNone(a)))
		case s.Announcer == "" && a == "":
			out = append(out, fmt.Sprintf("%s: ironlb does not announce it yet", s.Name))
		}
	}
	return out
}

func orNone(s string) string {
	if s == "" {
		return "none"
	}
	return s
}

// helmInstallCommand is the install prepare prints: the chart into the
// namespace MetalLB used, with migrationValues.
func helmInstallCommand(release, chart, ns string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "helm install %s %s -n %s --wait", release, chart, ns)
	for _, v := range migrationValues {
		b.WriteString(" --set " + v)
	}
	return b.String()
}
