//go:build e2e

package e2e

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"testing"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// TestMetrics scrapes the controller and the speakers over HTTPS with a
// ServiceAccount token (authn/authz as MetalLB), from the nodes: the
// metallb_* names MetalLB users' dashboards and alerts use are there, with
// values that match the walkthrough.
func TestMetrics(t *testing.T) {
	e := requireEnv(t)
	ips := applyWalkthrough(t, e)
	dumpOnFailure(t, e, nil)
	ctx := ctxT(t)
	// A reader allowed GET /metrics, as a Prometheus would be.
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "e2e-metrics", Namespace: Namespace}}
	role := &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: "e2e-metrics-reader"},
		Rules:      []rbacv1.PolicyRule{{NonResourceURLs: []string{"/metrics"}, Verbs: []string{"get"}}},
	}
	binding := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "e2e-metrics-reader"},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: role.Name},
		Subjects:   []rbacv1.Subject{{Kind: "ServiceAccount", Name: sa.Name, Namespace: Namespace}},
	}
	e.create(t, sa)
	e.create(t, role)
	e.create(t, binding)
	tok, err := e.CS.CoreV1().ServiceAccounts(Namespace).CreateToken(ctx, sa.Name, &authenticationv1.TokenRequest{}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	token := tok.Status.Token

	var pods corev1.PodList
	if err := e.C.List(ctx, &pods, client.InNamespace(Namespace), client.MatchingLabels{"app.kubernetes.io/name": "ironlb"}); err != nil {
		t.Fatal(err)
	}
	scrape := func(p *corev1.Pod, withToken bool) (string, error) {
		args := []string{"curl", "-sk", "-m", "5", "-w", "\n%{http_code}"}
		if withToken {
			args = append(args, "-H", "Authorization: Bearer "+token)
		}
		args = append(args, fmt.Sprintf("https://%s:9120/metrics", p.Status.PodIP))
		var last string
		for range 10 { // the SubjectAccessReview for a new binding may lag a moment
			r, err := e.Hosts.Run(ctx, p.Spec.NodeName, args...)
			if err != nil {
				return "", err
			}
			body, code, _ := cutLast(r.Stdout)
			if code == "200" {
				return body, nil
			}
			last = fmt.Sprintf("HTTP %s: %s", code, strings.TrimSpace(body))
			if !withToken {
				return "", fmt.Errorf("%s", last)
			}
		}
		return "", fmt.Errorf("%s", last)
	}

	controllerNames := []string{"metallb_allocator_addresses_total", "metallb_allocator_addresses_in_use_total",
		"metallb_allocator_ipv4_addresses_total", "metallb_k8s_client_config_loaded_bool", "metallb_k8s_client_config_stale_bool"}
	speakerNames := []string{"metallb_speaker_announced", "metallb_layer2_requests_received", "metallb_layer2_responses_sent",
		"metallb_layer2_gratuitous_sent", "metallb_k8s_client_config_loaded_bool", "metallb_k8s_client_config_stale_bool"}
	var inUse float64 = -1
	seen := map[string]bool{}
	announced := map[string]bool{}
	for i := range pods.Items {
		p := &pods.Items[i]
		comp := p.Labels["app.kubernetes.io/component"]
		if _, err := scrape(p, false); err == nil || !strings.Contains(err.Error(), "HTTP 401") {
			t.Errorf("%s: metrics without a token: %v, want HTTP 401", p.Name, err)
		}
		body, err := scrape(p, true)
		if err != nil {
			t.Errorf("%s: scraping with a token: %v", p.Name, err)
			continue
		}
		names := controllerNames
		if comp == "speaker" {
			names = speakerNames
		}
		// A vector with no series yet has no # TYPE line (a standby controller
		// allocates nothing, a speaker may announce nothing): look at the union
		// over each component's pods.
		for _, n := range names {
			if regexp.MustCompile(`(?m)^# TYPE ` + n + ` `).MatchString(body) {
				seen[comp+" "+n] = true
			}
		}
		if comp == "controller" {
			if v, ok := sample(body, "metallb_allocator_addresses_total", `pool="my-ippool"`); ok && v != 51 {
				t.Errorf("%s: metallb_allocator_addresses_total{pool=my-ippool} = %v, want 51", p.Name, v)
			}
			if v, ok := sample(body, "metallb_allocator_addresses_in_use_total", `pool="my-ippool"`); ok && v > inUse {
				inUse = v
			}
		} else {
			for _, line := range strings.Split(body, "\n") {
				if strings.HasPrefix(line, "metallb_speaker_announced{") && strings.HasSuffix(line, " 1") {
					for _, ip := range ips {
						if strings.Contains(line, `ip="`+ip+`"`) && strings.Contains(line, `node="`+p.Spec.NodeName+`"`) {
							announced[ip] = true
						}
					}
				}
			}
		}
	}
	for comp, names := range map[string][]string{"controller": controllerNames, "speaker": speakerNames} {
		for _, n := range names {
			if !seen[comp+" "+n] {
				t.Errorf("no %s pod exposes %s", comp, n)
			}
		}
	}
	if inUse < float64(len(ips)) {
		t.Errorf("metallb_allocator_addresses_in_use_total{pool=my-ippool} = %v on every controller, want >= %d", inUse, len(ips))
	}
	for _, ip := range ips {
		if !announced[ip] {
			t.Errorf("no speaker reports metallb_speaker_announced{ip=%q} 1", ip)
		}
	}
}

// cutLast splits curl's output from its trailing -w "\n%{http_code}".
func cutLast(s string) (body, last string, ok bool) {
	i := strings.LastIndex(s, "\n")
	if i < 0 {
		return "", s, false
	}
	return s[:i], strings.TrimSpace(s[i+1:]), true
}

// sample returns the value of the first sample of name whose labels contain sel.
func sample(body, name, sel string) (float64, bool) {
	for _, line := range strings.Split(body, "\n") {
		if strings.HasPrefix(line, name+"{") && strings.Contains(line, sel) {
			f := strings.Fields(line)
			v, err := strconv.ParseFloat(f[len(f)-1], 64)
			return v, err == nil
		}
	}
	return 0, false
}
