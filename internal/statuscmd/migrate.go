package statuscmd

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"

	"github.com/ironlb/ironlb/config/crd"
	"github.com/ironlb/ironlb/internal/statusview"
)

// migrateOptions are the flags of migrate-from-metallb and its phases.
type migrateOptions struct {
	kubeconfig, kubeContext, namespace, release, chart string
	dryRun                                             bool
	timeout                                            time.Duration
}

var (
	crdsGVR              = schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}
	bgpPeersGVR          = schema.GroupVersionResource{Group: "metallb.io", Version: "v1beta2", Resource: "bgppeers"}
	bgpPeersV1beta1GVR   = schema.GroupVersionResource{Group: "metallb.io", Version: "v1beta1", Resource: "bgppeers"}
	bgpAdvertisementsGVR = schema.GroupVersionResource{Group: "metallb.io", Version: "v1beta1", Resource: "bgpadvertisements"}
)

// metallbOnlyCRDs are MetalLB's BGP CRDs, which ironlb does not serve:
// finish deletes them when they hold no object.
var metallbOnlyCRDs = []string{
	"bfdprofiles.metallb.io", "bgpadvertisements.metallb.io", "bgppeers.metallb.io",
	"communities.metallb.io", "servicebgpstatuses.metallb.io",
}

const migrateLong = `migrate-from-metallb replaces a running MetalLB (layer 2 only, installed from its manifests
or its Helm chart) by ironlb without a failed request: every Service keeps its IP, every IP
keeps the node that announced it, and at no moment does nobody answer ARP/NDP for an IP.

  1. kubectl ironlb migrate-from-metallb           what it finds and will do (changes nothing)
  2. kubectl ironlb migrate-from-metallb prepare   upgrades the CRDs to ironlb's schemas (objects
                                                   kept), records every IP and its announcer, stops
                                                   MetalLB's controller (its speakers keep answering)
  3. helm install ironlb ... (the command prepare prints: other ports than MetalLB's speakers)
                                                   ironlb's speakers start announcing every IP from
                                                   the node MetalLB announced it from
  4. kubectl ironlb migrate-from-metallb finish    checks that, then removes MetalLB (a Helm release
                                                   with its record) but its CRDs and objects

Before finish, "kubectl ironlb migrate-from-metallb abort" (after "helm uninstall ironlb
--no-hooks") puts MetalLB back as it was. It refuses a MetalLB that runs BGP (BGPPeers,
BGPAdvertisements, FRR mode): ironlb has no BGP. The frr-k8s backend (the Helm chart's default)
is accepted when no BGP object exists. A Helm release of MetalLB is removed by finish, record
included: "helm uninstall metallb" would delete the CRDs and with them every pool.`

// NewMigrateCommand is `kubectl ironlb migrate-from-metallb` and its phases.
func NewMigrateCommand() *cobra.Command {
	o := &migrateOptions{}
	cmd := &cobra.Command{
		Use:           "migrate-from-metallb",
		Short:         "Replace a running MetalLB (layer 2) by ironlb without a failed request",
		Long:          migrateLong,
		Args:          cobra.NoArgs,
		SilenceUsage:  true,
		SilenceErrors: true,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return o.run(cmd, func(m *migration) error { return m.plan() })
		},
	}
	o.flags(cmd.Flags())
	phase := func(use, short string, fn func(*migration) error) *cobra.Command {
		c := &cobra.Command{
			Use: use, Short: short, Args: cobra.NoArgs, SilenceUsage: true, SilenceErrors: true,
			RunE: func(cmd *cobra.Command, _ []string) error { return o.run(cmd, fn) },
		}
		o.flags(c.Flags()) // the same flags, bound to the same options
		return c
	}
	cmd.AddCommand(
		phase("prepare", "Keep MetalLB's CRDs and objects, record every IP and announcer, stop MetalLB's controller", (*migration).prepare),
		phase("finish", "Check that ironlb announces every IP where MetalLB did, then remove MetalLB", (*migration).finish),
		phase("abort", "Before finish: give the IPs back to MetalLB (run helm uninstall ironlb --no-hooks first)", (*migration).abort),
	)
	return cmd
}

func (o *migrateOptions) flags(f interface {
	StringVar(*string, string, string, string)
	BoolVar(*bool, string, bool, string)
	DurationVar(*time.Duration, string, time.Duration, string)
}) {
	f.StringVar(&o.kubeconfig, "kubeconfig", "", "kubeconfig file (default: $KUBECONFIG, then ~/.kube/config)")
	f.StringVar(&o.kubeContext, "context", "", "kubeconfig context (default: the current one)")
	f.StringVar(&o.namespace, "namespace", DefaultNamespace, "namespace MetalLB runs in; ironlb is installed into it")
	f.StringVar(&o.release, "release", "ironlb", "Helm release name of ironlb (the printed helm install; finish looks for its speakers)")
	f.StringVar(&o.chart, "chart", "charts/ironlb", "ironlb's chart, as the printed helm install names it")
	f.BoolVar(&o.dryRun, "dry-run", false, "print what the phase would do, change nothing")
	f.DurationVar(&o.timeout, "timeout", 5*time.Minute, "give up after this long")
}

// migration is one phase's run: the clients and where it prints.
type migration struct {
	o   *migrateOptions
	cfg *rest.Config
	cs  kubernetes.Interface
	dc  dynamic.Interface
	out io.Writer
	ctx context.Context
}

func (o *migrateOptions) run(cmd *cobra.Command, fn func(*migration) error) error {
	ctx, cancel := context.WithTimeout(cmd.Context(), o.timeout)
	defer cancel()
	cfg, err := kubeconfigLoader(o.kubeconfig, o.kubeContext).ClientConfig()
	if err != nil {
		return &ExitError{Code: 2, Err: fmt.Errorf("kubeconfig: %w", err)}
	}
	m := &migration{o: o, cfg: cfg, out: cmd.OutOrStdout(), ctx: ctx}
	if m.cs, err = kubernetes.NewForConfig(cfg); err != nil {
		return &ExitError{Code: 2, Err: err}
	}
	if m.dc, err = dynamic.NewForConfig(cfg); err != nil {
		return &ExitError{Code: 2, Err: err}
	}
	if err := fn(m); err != nil {
		var ee *ExitError
		if errors.As(err, &ee) {
			return err
		}
		return &ExitError{Code: 2, Err: err}
	}
	return nil
}

// found is what inspect read of the cluster.
type found struct {
	metallb  *metallbInstall
	missing  string // why metallb is nil
	refusals []string
	services []migratedService
	webhooks []admissionWebhook
}

// admissionWebhook is one webhook of MetalLB's validating configuration.
type admissionWebhook struct{ config, name, policy string }

func (w admissionWebhook) key() string { return w.config + "/" + w.name }

// inspect reads the namespace's workloads, MetalLB's BGP objects, its
// webhooks, and the Services with their announcers; an error when there is no
// MetalLB to migrate or it must be refused (usable).
func (m *migration) inspect() (*found, error) {
	ns := m.o.namespace
	deps, err := m.cs.AppsV1().Deployments(ns).List(m.ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("listing the Deployments of namespace %s: %w", ns, err)
	}
	dss, err := m.cs.AppsV1().DaemonSets(ns).List(m.ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("listing the DaemonSets of namespace %s: %w", ns, err)
	}
	f := &found{}
	f.metallb, f.missing = detectMetalLB(deps.Items, dss.Items)
	frr := ""
	for i := range dss.Items {
		if d := &dss.Items[i]; f.metallb != nil && d.Name == f.metallb.Speaker {
			frr = frrMode(d)
		}
	}
	peers, err := m.names(bgpPeersGVR, bgpPeersV1beta1GVR)
	if err != nil {
		return nil, err
	}
	ads, err := m.names(bgpAdvertisementsGVR)
	if err != nil {
		return nil, err
	}
	f.refusals = migrationRefusals(frr, peers, ads)
	svcs, err := m.cs.CoreV1().Services("").List(m.ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("listing Services: %w", err)
	}
	sts, err := l2Statuses(m.ctx, m.dc, ns)
	if err != nil && !apierrors.IsNotFound(err) {
		return nil, fmt.Errorf("listing the ServiceL2Status objects of namespace %s: %w", ns, err)
	}
	f.services = servedServices(svcs.Items, sts)
	vwcs, err := m.cs.AdmissionregistrationV1().ValidatingWebhookConfigurations().List(m.ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("listing ValidatingWebhookConfigurations: %w", err)
	}
	for _, c := range vwcs.Items {
		for _, w := range c.Webhooks {
			s := w.ClientConfig.Service
			if s == nil || s.Namespace != ns || !strings.HasPrefix(s.Name, "metallb-") {
				continue
			}
			p := "Fail"
			if w.FailurePolicy != nil {
				p = string(*w.FailurePolicy)
			}
			f.webhooks = append(f.webhooks, admissionWebhook{config: c.Name, name: w.Name, policy: p})
		}
	}
	if err := f.usable(ns); err != nil {
		return nil, err
	}
	return f, nil
}

// names lists the objects of a MetalLB resource in the namespace, read at
// the first of its versions the API server serves; a resource whose CRD is
// not installed has none.
func (m *migration) names(versions ...schema.GroupVersionResource) ([]string, error) {
	for _, gvr := range versions {
		l, err := m.dc.Resource(gvr).Namespace(m.o.namespace).List(m.ctx, metav1.ListOptions{})
		if apierrors.IsNotFound(err) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("listing %s in namespace %s: %w", gvr.Resource, m.o.namespace, err)
		}
		var out []string
		for _, it := range l.Items {
			out = append(out, it.GetName())
		}
		return out, nil
	}
	return nil, nil
}

// usable checks what every phase needs: a MetalLB install that runs no BGP.
func (f *found) usable(ns string) error {
	if f.metallb == nil {
		return fmt.Errorf("namespace %s: %s; nothing to migrate (--namespace names MetalLB's namespace)", ns, f.missing)
	}
	if len(f.refusals) > 0 {
		return fmt.Errorf("cannot migrate: %s", strings.Join(f.refusals, "; "))
	}
	return nil
}

// plan prints what was found and what each phase does.
func (m *migration) plan() error {
	f, err := m.inspect()
	if err != nil {
		return err
	}
	ns, ml := m.o.namespace, f.metallb
	how := "its manifests"
	if ml.HelmRelease != "" {
		how = "Helm release " + ml.HelmRelease
	}
	say(m.out, "MetalLB in namespace %s (%s): controller Deployment %s (%d replicas), speaker DaemonSet %s; layer 2 only.\n",
		ns, how, ml.Controller, ml.Replicas, ml.Speaker)
	m.printServices(f.services)
	say(m.out, "\nprepare will:\n")
	say(m.out, "  - apply ironlb's schemas to the CRDs ipaddresspools, l2advertisements, servicel2statuses and\n    configurationstates (objects kept)\n")
	say(m.out, "  - record every IP and its announcer in ConfigMap %s/%s\n", ns, migrationConfigMap)
	for _, w := range f.webhooks {
		say(m.out, "  - set failurePolicy Ignore on webhook %s (MetalLB's controller will not serve it)\n", w.key())
	}
	say(m.out, "  - scale Deployment %s to 0: nothing withdraws or re-allocates an IP from now on; MetalLB's\n    speakers keep answering\n", ml.Controller)
	say(m.out, "then: %s\n", helmInstallCommand(m.o.release, m.o.chart, ns))
	say(m.out, "finish will wait until ironlb's speakers announce every IP from the node above, then delete\nMetalLB's speakers, controller, webhooks, RBAC, Secrets and its BGP-only CRDs while empty; the\nmetallb.io CRDs and objects, and the namespace, stay.\n")
	if ml.HelmRelease != "" {
		say(m.out, "Do not run helm uninstall %s: it would delete the CRDs and every pool. finish deletes the\nrelease's objects but its CRDs, and its record.\n", ml.HelmRelease)
	}
	return nil
}

func (m *migration) printServices(svcs []migratedService) {
	if len(svcs) == 0 {
		say(m.out, "No LoadBalancer Service shows an IP.\n")
		return
	}
	say(m.out, "%d LoadBalancer Services keep their IPs and announcers:\n", len(svcs))
	for _, s := range svcs {
		say(m.out, "  %-40s %-32s %s\n", s.Name, strings.Join(s.IPs, ","), orNone(s.Announcer))
	}
}

// prepare records the state, upgrades the CRDs, and stops MetalLB's controller.
func (m *migration) prepare() error {
	f, err := m.inspect()
	if err != nil {
		return err
	}
	ns := m.o.namespace
	st, err := m.loadState()
	if err != nil {
		return err
	}
	if st == nil {
		// First run: record what MetalLB serves now. A re-run keeps the
		// first record (the controller is already scaled down then).
		st = &migrationState{MetalLB: *f.metallb, Services: f.services, WebhookPolicies: map[string]string{}}
		for _, w := range f.webhooks {
			st.WebhookPolicies[w.key()] = w.policy
		}
	}
	m.printServices(st.Services)
	if m.o.dryRun {
		say(m.out, "(dry run: nothing changed)\n")
		return nil
	}
	if err := m.applyCRDs(); err != nil {
		return err
	}
	if err := m.saveState(st); err != nil {
		return err
	}
	say(m.out, "recorded them in ConfigMap %s/%s\n", ns, migrationConfigMap)
	for _, w := range f.webhooks {
		if err := m.setWebhookPolicy(w, "Ignore"); err != nil {
			return err
		}
	}
	if err := m.scale(st.MetalLB.Controller, 0); err != nil {
		return err
	}
	if err := m.waitGone(st.MetalLB.ControllerSelector, "MetalLB's controller Pods"); err != nil {
		return err
	}
	say(m.out, "MetalLB's controller is stopped; its speakers keep answering for every IP.\n\nNext, install ironlb with ports MetalLB's speakers do not use (keep these values):\n\n  %s\n\nthen run: kubectl ironlb migrate-from-metallb finish\n",
		helmInstallCommand(m.o.release, m.o.chart, ns))
	return nil
}

// applyCRDs applies ironlb's schemas over MetalLB's CRDs (server-side, so the
// objects stay): ironlb's controller writes status fields MetalLB's schemas
// would prune.
func (m *migration) applyCRDs() error {
	objs, err := crd.Objects()
	if err != nil {
		return err
	}
	for _, o := range objs {
		if _, err := m.dc.Resource(crdsGVR).Apply(m.ctx, o.GetName(), o, metav1.ApplyOptions{FieldManager: "kubectl-ironlb", Force: true}); err != nil {
			return fmt.Errorf("applying ironlb's CRD %s: %w", o.GetName(), err)
		}
	}
	say(m.out, "applied ironlb's schemas to %d metallb.io CRDs (their objects stay)\n", len(objs))
	return nil
}

func (m *migration) loadState() (*migrationState, error) {
	cm, err := m.cs.CoreV1().ConfigMaps(m.o.namespace).Get(m.ctx, migrationConfigMap, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading ConfigMap %s/%s: %w", m.o.namespace, migrationConfigMap, err)
	}
	var st migrationState
	if err := json.Unmarshal([]byte(cm.Data["state.json"]), &st); err != nil {
		return nil, fmt.Errorf("ConfigMap %s/%s: key state.json: %w", m.o.namespace, migrationConfigMap, err)
	}
	return &st, nil
}

func (m *migration) saveState(st *migrationState) error {
	b, err := json.MarshalIndent(st, "", "  ")
	if err != nil {
		return err
	}
	cm := &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: migrationConfigMap, Namespace: m.o.namespace,
			Labels: map[string]string{"app.kubernetes.io/managed-by": "kubectl-ironlb"}},
		Data: map[string]string{"state.json": string(b)},
	}
	_, err = m.cs.CoreV1().ConfigMaps(m.o.namespace).Create(m.ctx, cm, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		_, err = m.cs.CoreV1().ConfigMaps(m.o.namespace).Update(m.ctx, cm, metav1.UpdateOptions{})
	}
	if err != nil {
		return fmt.Errorf("writing ConfigMap %s/%s: %w", m.o.namespace, migrationConfigMap, err)
	}
	return nil
}

// setWebhookPolicy sets one webhook's failurePolicy (JSON patch on its
// index, which it verifies by name first).
func (m *migration) setWebhookPolicy(w admissionWebhook, policy string) error {
	c, err := m.cs.AdmissionregistrationV1().ValidatingWebhookConfigurations().Get(m.ctx, w.config, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("reading ValidatingWebhookConfiguration %s: %w", w.config, err)
	}
	for i, h := range c.Webhooks {
		if h.Name != w.name {
			continue
		}
		patch := fmt.Sprintf(`[{"op":"test","path":"/webhooks/%d/name","value":%q},{"op":"replace","path":"/webhooks/%d/failurePolicy","value":%q}]`, i, w.name, i, policy)
		if _, err := m.cs.AdmissionregistrationV1().ValidatingWebhookConfigurations().Patch(m.ctx, w.config, types.JSONPatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
			return fmt.Errorf("setting failurePolicy %s on webhook %s: %w", policy, w.key(), err)
		}
		say(m.out, "webhook %s: failurePolicy %s\n", w.key(), policy)
	}
	return nil
}

func (m *migration) scale(deployment string, replicas int32) error {
	patch := fmt.Sprintf(`{"spec":{"replicas":%d}}`, replicas)
	if _, err := m.cs.AppsV1().Deployments(m.o.namespace).Patch(m.ctx, deployment, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		return fmt.Errorf("scaling Deployment %s/%s to %d: %w", m.o.namespace, deployment, replicas, err)
	}
	say(m.out, "scaled Deployment %s/%s to %d\n", m.o.namespace, deployment, replicas)
	return nil
}

// waitGone polls until no Pod matches selector.
func (m *migration) waitGone(selector map[string]string, what string) error {
	sel := labels.SelectorFromSet(selector).String()
	return m.poll(what+" gone", func() (bool, string, error) {
		l, err := m.cs.CoreV1().Pods(m.o.namespace).List(m.ctx, metav1.ListOptions{LabelSelector: sel})
		if err != nil {
			return false, "", err
		}
		var left []string
		for _, p := range l.Items {
			left = append(left, p.Name)
		}
		return len(left) == 0, strings.Join(left, ", ") + " left", nil
	})
}

// poll runs check every second until it is done, printing what it waits
// for when that changes; on timeout the error says what was last seen.
func (m *migration) poll(what string, check func() (bool, string, error)) error {
	last := ""
	for {
		ok, detail, err := check()
		if err != nil {
			return fmt.Errorf("waiting for %s: %w", what, err)
		}
		if ok {
			return nil
		}
		if detail != last {
			say(m.out, "waiting for %s: %s\n", what, detail)
			last = detail
		}
		select {
		case <-m.ctx.Done():
			return fmt.Errorf("gave up waiting for %s (--timeout): %s", what, last)
		case <-time.After(time.Second):
		}
	}
}

// finish checks that ironlb has taken over every IP where MetalLB announced
// it, then removes MetalLB but its CRDs, objects and namespace.
func (m *migration) finish() error {
	st, err := m.loadState()
	if err != nil {
		return err
	}
	ns := m.o.namespace
	if st == nil {
		return fmt.Errorf("no ConfigMap %s/%s: run kubectl ironlb migrate-from-metallb prepare first", ns, migrationConfigMap)
	}
	if err := m.waitIronlbReady(); err != nil {
		return err
	}
	if err := m.waitTakenOver(st); err != nil {
		return err
	}
	say(m.out, "ironlb's speakers announce every IP from the node MetalLB announced it from.\n")
	if m.o.dryRun {
		say(m.out, "(dry run: MetalLB left running)\n")
		return nil
	}
	if err := m.removeSpeakers(st.MetalLB); err != nil {
		return err
	}
	if err := m.removeMetalLB(st); err != nil {
		return err
	}
	svcs, err := m.cs.CoreV1().Services("").List(m.ctx, metav1.ListOptions{})
	if err != nil {
		return fmt.Errorf("listing Services: %w", err)
	}
	if changed := ipChanges(st.Services, servedServices(svcs.Items, nil)); len(changed) > 0 {
		return fmt.Errorf("these Services' IPs changed: %s", strings.Join(changed, "; "))
	}
	if err := m.cs.CoreV1().ConfigMaps(ns).Delete(m.ctx, migrationConfigMap, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("deleting ConfigMap %s/%s: %w", ns, migrationConfigMap, err)
	}
	say(m.out, "MetalLB removed; ironlb serves all %d Services with the same IPs and announcers.\n", len(st.Services))
	return nil
}

// waitIronlbReady waits for ironlb's speakers on every node MetalLB's ran on.
func (m *migration) waitIronlbReady() error {
	name := m.o.release + "-speaker"
	return m.poll("ironlb's speakers (DaemonSet "+name+") ready", func() (bool, string, error) {
		ds, err := m.cs.AppsV1().DaemonSets(m.o.namespace).Get(m.ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return false, "not installed: run the helm install prepare printed (--release names it)", nil
		}
		if err != nil {
			return false, "", err
		}
		s := ds.Status
		return s.DesiredNumberScheduled > 0 && s.NumberReady == s.DesiredNumberScheduled && s.UpdatedNumberScheduled == s.DesiredNumberScheduled,
			fmt.Sprintf("%d of %d ready", s.NumberReady, s.DesiredNumberScheduled), nil
	})
}

// waitTakenOver waits until every Service still shows its recorded IPs and
// ironlb's speakers announce it from its recorded node.
func (m *migration) waitTakenOver(st *migrationState) error {
	return m.poll("ironlb to announce every IP where MetalLB did", func() (bool, string, error) {
		svcs, err := m.cs.CoreV1().Services("").List(m.ctx, metav1.ListOptions{})
		if err != nil {
			return false, "", err
		}
		if changed := ipChanges(st.Services, servedServices(svcs.Items, nil)); len(changed) > 0 {
			// prepare stopped MetalLB's controller, so only ironlb's can
			// have changed an IP: it refused the IP (see its events).
			return false, "", fmt.Errorf("these Services' IPs changed (kubectl describe service shows why; MetalLB is left running): %s", strings.Join(changed, "; "))
		}
		// MetalLB's Helm chart labels its speakers component=speaker too.
		sel := DefaultSelector + ",app.kubernetes.io/instance=" + m.o.release
		r, err := speakerReport(m.ctx, m.cfg, m.cs, m.o.namespace, sel, DefaultContainer, statusview.Filter{})
		if err != nil {
			// The speakers may still be starting: say so and keep waiting.
			return false, err.Error(), nil //nolint:nilerr // a transient state, not a failure
		}
		mis := announcerMismatches(st.Services, r)
		return len(mis) == 0, strings.Join(mis, "; "), nil
	})
}

// removeSpeakers deletes MetalLB's speaker DaemonSet and then all its Pods
// at once. Each speaker leaves MetalLB's memberlist when it stops, and one
// still running would take the IPs of the ones that left and announce them
// from its own MAC; deleted together, they stop within the same moment.
// ironlb's speakers answer for every IP throughout, from the same nodes.
func (m *migration) removeSpeakers(ml metallbInstall) error {
	ns := m.o.namespace
	orphan := metav1.DeletePropagationOrphan
	err := m.cs.AppsV1().DaemonSets(ns).Delete(m.ctx, ml.Speaker, metav1.DeleteOptions{PropagationPolicy: &orphan})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("deleting DaemonSet %s/%s: %w", ns, ml.Speaker, err)
	}
	sel := labels.SelectorFromSet(ml.SpeakerSelector).String()
	pods, err := m.cs.CoreV1().Pods(ns).List(m.ctx, metav1.ListOptions{LabelSelector: sel})
	if err != nil {
		return fmt.Errorf("listing MetalLB's speaker Pods: %w", err)
	}
	var wg sync.WaitGroup
	errs := make([]error, len(pods.Items))
	for i := range pods.Items {
		wg.Go(func() {
			p := &pods.Items[i]
			err := m.cs.CoreV1().Pods(ns).Delete(m.ctx, p.Name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)})
			if err != nil && !apierrors.IsNotFound(err) {
				errs[i] = fmt.Errorf("deleting Pod %s/%s: %w", ns, p.Name, err)
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return err
	}
	say(m.out, "deleted MetalLB's speakers (DaemonSet %s, %d Pods at once)\n", ml.Speaker, len(pods.Items))
	return m.waitGone(ml.SpeakerSelector, "MetalLB's speaker Pods")
}

// metallbObject is one of MetalLB's other objects finish deletes.
type metallbObject struct {
	kind, name string
	del        func(ctx context.Context, name string, opts metav1.DeleteOptions) error
}

// removeMetalLB deletes MetalLB's controller, webhooks, Service, Secrets,
// ConfigMap, RBAC and BGP-only CRDs (while empty), and a Helm release's every
// object and record (removeHelmRelease); the metallb.io CRDs ironlb serves,
// their objects and the namespace stay.
func (m *migration) removeMetalLB(st *migrationState) error {
	ns := m.o.namespace
	cs := m.cs
	bg := metav1.DeletePropagationBackground
	var deleted []string
	if rel := st.MetalLB.HelmRelease; rel != "" {
		d, err := m.removeHelmRelease(rel)
		deleted = append(deleted, d...)
		if err != nil {
			return err
		}
	}
	// The manifests' objects, and what MetalLB creates at run time (a Helm
	// release's are gone by now: not found).
	objs := []metallbObject{{"Deployment", st.MetalLB.Controller, cs.AppsV1().Deployments(ns).Delete}}
	cfgs := map[string]bool{}
	for k := range st.WebhookPolicies {
		cfgs[strings.SplitN(k, "/", 2)[0]] = true
	}
	for c := range cfgs {
		objs = append(objs, metallbObject{"ValidatingWebhookConfiguration", c, cs.AdmissionregistrationV1().ValidatingWebhookConfigurations().Delete})
	}
	// The names the manifests and the Helm chart (release prefix) give them.
	prefix := ""
	if r := st.MetalLB.HelmRelease; r != "" {
		prefix = r + "-"
	}
	for _, n := range []string{"metallb-webhook-service", prefix + "webhook-service"} {
		objs = append(objs, metallbObject{"Service", n, cs.CoreV1().Services(ns).Delete})
	}
	for _, n := range []string{"metallb-webhook-cert", "memberlist", prefix + "memberlist", prefix + "webhook-server-cert"} {
		objs = append(objs, metallbObject{"Secret", n, cs.CoreV1().Secrets(ns).Delete})
	}
	objs = append(objs, metallbObject{"ConfigMap", "metallb-excludel2", cs.CoreV1().ConfigMaps(ns).Delete})
	sel := metav1.ListOptions{LabelSelector: "app=metallb"}
	if st.MetalLB.HelmRelease != "" {
		sel.LabelSelector = "app.kubernetes.io/instance=" + st.MetalLB.HelmRelease
	}
	add := func(kind string, names []string, err error, del func(context.Context, string, metav1.DeleteOptions) error) error {
		if err != nil {
			return fmt.Errorf("listing MetalLB's %ss: %w", kind, err)
		}
		for _, n := range names {
			objs = append(objs, metallbObject{kind, n, del})
		}
		return nil
	}
	sas, err := cs.CoreV1().ServiceAccounts(ns).List(m.ctx, sel)
	if err := add("ServiceAccount", objectNames(sas, err), err, cs.CoreV1().ServiceAccounts(ns).Delete); err != nil {
		return err
	}
	roles, err := cs.RbacV1().Roles(ns).List(m.ctx, sel)
	if err := add("Role", objectNames(roles, err), err, cs.RbacV1().Roles(ns).Delete); err != nil {
		return err
	}
	rbs, err := cs.RbacV1().RoleBindings(ns).List(m.ctx, sel)
	if err := add("RoleBinding", objectNames(rbs, err), err, cs.RbacV1().RoleBindings(ns).Delete); err != nil {
		return err
	}
	crs, err := cs.RbacV1().ClusterRoles().List(m.ctx, sel)
	if err := add("ClusterRole", objectNames(crs, err), err, cs.RbacV1().ClusterRoles().Delete); err != nil {
		return err
	}
	crbs, err := cs.RbacV1().ClusterRoleBindings().List(m.ctx, sel)
	if err := add("ClusterRoleBinding", objectNames(crbs, err), err, cs.RbacV1().ClusterRoleBindings().Delete); err != nil {
		return err
	}
	for _, o := range objs {
		err := o.del(m.ctx, o.name, metav1.DeleteOptions{PropagationPolicy: &bg})
		switch {
		case err == nil:
			deleted = append(deleted, o.kind+" "+o.name)
		case !apierrors.IsNotFound(err):
			return fmt.Errorf("deleting MetalLB's %s %s: %w", o.kind, o.name, err)
		}
	}
	for _, c := range metallbOnlyCRDs {
		gone, err := m.deleteEmptyCRD(c)
		if err != nil {
			return err
		}
		if gone {
			deleted = append(deleted, "CustomResourceDefinition "+c)
		}
	}
	slices.Sort(deleted)
	say(m.out, "deleted %s\n", strings.Join(deleted, ", "))
	return nil
}

// objectNames returns the names of a typed list's items (nil on err).
func objectNames(list runtime.Object, err error) []string {
	if err != nil {
		return nil
	}
	var out []string
	_ = meta.EachListItem(list, func(o runtime.Object) error {
		if a, err := meta.Accessor(o); err == nil {
			out = append(out, a.GetName())
		}
		return nil
	})
	return out
}

// deleteEmptyCRD deletes one of MetalLB's BGP CRDs if no object of it
// exists anywhere, and says whether it did.
func (m *migration) deleteEmptyCRD(name string) (bool, error) {
	c, err := m.dc.Resource(crdsGVR).Get(m.ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("reading CRD %s: %w", name, err)
	}
	plural, _, _ := unstructured.NestedString(c.Object, "spec", "names", "plural")
	vers, _, _ := unstructured.NestedSlice(c.Object, "spec", "versions")
	for _, v := range vers {
		vm, _ := v.(map[string]any)
		if served, _ := vm["served"].(bool); !served {
			continue
		}
		ver, _ := vm["name"].(string)
		l, err := m.dc.Resource(schema.GroupVersionResource{Group: "metallb.io", Version: ver, Resource: plural}).List(m.ctx, metav1.ListOptions{Limit: 1})
		if err != nil {
			return false, fmt.Errorf("listing %s: %w", name, err)
		}
		if len(l.Items) > 0 {
			say(m.out, "kept CRD %s: it holds objects\n", name)
			return false, nil
		}
		break
	}
	if err := m.dc.Resource(crdsGVR).Delete(m.ctx, name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		return false, fmt.Errorf("deleting CRD %s: %w", name, err)
	}
	return true, nil
}

// abort gives the IPs back to MetalLB before finish: the webhooks' policies
// and the controller's replicas as they were. ironlb must be uninstalled
// first without its cleanup hook, which would release every IP.
func (m *migration) abort() error {
	st, err := m.loadState()
	if err != nil {
		return err
	}
	ns := m.o.namespace
	if st == nil {
		return fmt.Errorf("no ConfigMap %s/%s: nothing to abort (prepare did not run, or finish completed)", ns, migrationConfigMap)
	}
	if _, err := m.cs.AppsV1().DaemonSets(ns).Get(m.ctx, m.o.release+"-speaker", metav1.GetOptions{}); err == nil {
		return fmt.Errorf("ironlb is installed (DaemonSet %s/%s-speaker): run helm uninstall %s -n %s --no-hooks first (the hook would release every IP)", ns, m.o.release, m.o.release, ns)
	}
	if m.o.dryRun {
		say(m.out, "would restore the webhooks' failure policies and scale %s back to %d (dry run)\n", st.MetalLB.Controller, st.MetalLB.Replicas)
		return nil
	}
	for k, p := range st.WebhookPolicies {
		cfg, name, _ := strings.Cut(k, "/")
		if err := m.setWebhookPolicy(admissionWebhook{config: cfg, name: name}, p); err != nil {
			return err
		}
	}
	if err := m.scale(st.MetalLB.Controller, st.MetalLB.Replicas); err != nil {
		return err
	}
	if err := m.cs.CoreV1().ConfigMaps(ns).Delete(m.ctx, migrationConfigMap, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("deleting ConfigMap %s/%s: %w", ns, migrationConfigMap, err)
	}
	say(m.out, "MetalLB is as it was before prepare; its controller keeps the IPs the Services show.\n")
	return nil
}
