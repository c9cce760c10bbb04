//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/ironlb/ironlb/api/v1beta1"
	"github.com/ironlb/ironlb/test/lab/labctl"
)

// lbService is a LoadBalancer Service on port 80 in front of pods labelled
// app=selector; ip, when set, is requested with metallb.io/loadBalancerIPs.
func lbService(name, selector, ip string) *corev1.Service {
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", Annotations: map[string]string{}},
		Spec: corev1.ServiceSpec{
			Type:     corev1.ServiceTypeLoadBalancer,
			Selector: map[string]string{"app": selector},
			Ports:    []corev1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromInt32(80), Protocol: corev1.ProtocolTCP}},
		},
	}
	if ip != "" {
		svc.Annotations["metallb.io/loadBalancerIPs"] = ip
	}
	return svc
}

// singleStack makes svc a SingleStack Service of one family.
func singleStack(svc *corev1.Service, family corev1.IPFamily) {
	policy := corev1.IPFamilyPolicySingleStack
	svc.Spec.IPFamilyPolicy = &policy
	svc.Spec.IPFamilies = []corev1.IPFamily{family}
}

// createL2Pool creates the IPAddressPool name of cidr, given only to Services
// that ask for it (metallb.io/address-pool), and the L2Advertisement adv of
// it, to the workers only when workersOnly (killing an announcer then leaves
// the control plane alive); both are deleted when the test ends.
func (e *Env) createL2Pool(t testing.TB, name, adv, cidr string, workersOnly bool) {
	t.Helper()
	a := &v1beta1.L2Advertisement{
		ObjectMeta: metav1.ObjectMeta{Name: adv, Namespace: Namespace},
		Spec:       v1beta1.L2AdvertisementSpec{IPAddressPools: []string{name}},
	}
	if workersOnly {
		a.Spec.NodeSelectors = []metav1.LabelSelector{{MatchExpressions: []metav1.LabelSelectorRequirement{
			{Key: labctl.ControlPlaneRole, Operator: metav1.LabelSelectorOpDoesNotExist},
		}}}
	}
	e.create(t, &v1beta1.IPAddressPool{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: Namespace},
		Spec:       v1beta1.IPAddressPoolSpec{Addresses: []string{cidr}, AutoAssign: ptr(false)},
	})
	e.create(t, a)
}

// create creates obj and deletes it when the test ends.
func (e *Env) create(t testing.TB, obj client.Object) {
	t.Helper()
	ctx := context.Background()
	_ = e.C.Delete(ctx, obj) // a leftover of an interrupted run
	poll(t, time.Minute, fmt.Sprintf("%T %s created", obj, obj.GetName()), func() (bool, string) {
		o := obj.DeepCopyObject().(client.Object)
		o.SetResourceVersion("")
		err := e.C.Create(ctx, o)
		if apierrors.IsAlreadyExists(err) {
			return false, "still being deleted"
		}
		if err != nil {
			return false, err.Error()
		}
		return true, ""
	})
	t.Cleanup(func() {
		if err := e.C.Delete(context.Background(), obj); err != nil && !apierrors.IsNotFound(err) {
			t.Logf("deleting %s: %v", obj.GetName(), err)
		}
	})
}

// whoamiPod is a traefik/whoami pod pinned to node.
func whoamiPod(name, app, node string) *corev1.Pod {
	zero := int64(0)
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", Labels: map[string]string{"app": app}},
		Spec: corev1.PodSpec{
			NodeName:                      node,
			Containers:                    []corev1.Container{{Name: "container", Image: "traefik/whoami"}},
			TerminationGracePeriodSeconds: &zero,
		},
	}
}

// topology describes the cluster: its nodes, the walkthrough's backends and
// the addresses taken.
type topology struct {
	nodes        []string // every node
	controlPlane string
	backends     []string // nodes of webpod1 and webpod2
	taken        map[string]bool
}

func (e *Env) topology(t testing.TB) topology {
	t.Helper()
	ctx := context.Background()
	var nodes corev1.NodeList
	if err := e.C.List(ctx, &nodes); err != nil {
		t.Fatal(err)
	}
	var tp topology
	for _, n := range nodes.Items {
		tp.nodes = append(tp.nodes, n.Name)
		if _, ok := n.Labels["node-role.kubernetes.io/control-plane"]; ok {
			tp.controlPlane = n.Name
		}
	}
	for _, p := range walkthroughPods {
		n, err := e.podNode(ctx, "default", p)
		if err != nil {
			t.Fatal(err)
		}
		tp.backends = append(tp.backends, n)
	}
	var svcs corev1.ServiceList
	if err := e.C.List(ctx, &svcs); err != nil {
		t.Fatal(err)
	}
	tp.taken = map[string]bool{}
	for _, s := range svcs.Items {
		for _, in := range s.Status.LoadBalancer.Ingress {
			tp.taken[in.IP] = true
		}
	}
	return tp
}

// freeIP returns a free address of the walkthrough's pool, from the top so
// that the walkthrough's own first-free allocations are not disturbed. Where
// the IP will be announced is observed, not predicted: a new IP goes to the
// least-loaded eligible node.
func (tp topology) freeIP(t testing.TB) string {
	t.Helper()
	for i := 50; i >= 3; i-- {
		if ip := poolAddr(i); !tp.taken[ip] {
			tp.taken[ip] = true
			return ip
		}
	}
	t.Fatal("no free address left in the walkthrough's pool")
	return ""
}

func without(list []string, drop ...string) []string {
	var out []string
	for _, s := range list {
		if !slices.Contains(drop, s) {
			out = append(out, s)
		}
	}
	return out
}

// waitServing waits until ip answers from the client.
func (e *Env) waitServing(t testing.TB, ip string) {
	t.Helper()
	poll(t, 2*time.Minute, ip+" answering from "+ClientHost, func() (bool, string) {
		_, ok := e.curlOnce(context.Background(), ip)
		return ok, "curl failed"
	})
}

// waitNeighbour waits until the client's neighbour entry for ip is node's MAC
// (sending a request first, so that the client resolves it).
func (e *Env) waitNeighbour(t testing.TB, ip, node string, macs map[string]string) {
	t.Helper()
	poll(t, time.Minute, fmt.Sprintf("%s's neighbour entry for %s = %s's MAC %s", ClientHost, ip, node, macs[node]), func() (bool, string) {
		e.curlOnce(context.Background(), ip)
		mac, line, err := e.neighMAC(context.Background(), ip)
		if err != nil {
			return false, err.Error()
		}
		return mac == macs[node], line
	})
}
