//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/ironlb/ironlb/test/e2e/probe"
)

// TestMigrateFromMetalLB is issue 27: MetalLB v0.16.2 installed from its manifest with the
// walkthrough applied, then replaced by ironlb with `kubectl ironlb migrate-from-metallb`
// while mypc holds 4 keep-alive connections to each Service, opens a new connection every
// 20 ms to svc2, and asks every IP by ARP every 50 ms. First the way back before finish
// (prepare, the helm install it prints, helm uninstall --no-hooks, abort), then for good
// (prepare, the helm install, finish). Targets: no failed new connection, no broken
// keep-alive connection, every Service keeps its IP and its announcer, and every ARP request
// for an IP is answered by the MAC of the node MetalLB announced it from, with no silence.
// Then the way back after finish: ironlb uninstalled without its cleanup hook and MetalLB
// installed again keeps every IP. The suite's ironlb is re-installed afterwards, whatever the
// outcome.
func TestMigrateFromMetalLB(t *testing.T) {
	e := requireEnv(t)
	if _, ok := e.Hosts.(LabHosts); !ok {
		t.Skip("needs the lab (MetalLB's images run from bin/)")
	}
	manifests, helm := metallbImpl(t, e), metallbHelmImpl(t, e)
	all := []*lbImpl{ironlbImpl, manifests, helm}
	t.Cleanup(func() {
		// Leave the suite's ironlb as the other tests expect it, whatever happened: MetalLB
		// removed, ironlb's CRDs in place and the chart's default values (not the
		// migration's ports).
		e.switchTo(t, ironlbImpl, all)
		ctx := context.Background()
		if out, err := e.kubectl(ctx, "", "apply", "--server-side", "--force-conflicts", "-f", filepath.Join(e.Root, "charts", "ironlb", "crds")); err != nil {
			t.Errorf("applying ironlb's CRDs: %v\n%s", err, out)
		}
		if err := e.install(ctx); err != nil {
			t.Error(err)
		}
	})
	t.Run("manifests", func(t *testing.T) { migrateFromMetalLB(t, e, manifests, all, true) })
	t.Run("helm", func(t *testing.T) { migrateFromMetalLB(t, e, helm, all, false) })
}

// metallbHelmImpl is MetalLB installed with its Helm chart (from its module, with the
// frr-k8s backend off: the lab has no frr-k8s image, and layer 2 does not use it).
func metallbHelmImpl(t testing.TB, e *Env) *lbImpl {
	chart := filepath.Join(metallbModule(t, e), "charts", "metallb")
	return &lbImpl{
		name:       "MetalLB (Helm)",
		controller: "metallb-controller", speaker: "metallb-speaker", webhookService: "metallb-webhook-service",
		speakerLabels: map[string]string{"app.kubernetes.io/name": "metallb", "app.kubernetes.io/component": "speaker"},
		install: func(e *Env, ctx context.Context) error {
			if out, err := e.run(ctx, e.Helm, "--kubeconfig", e.Kubeconfig, "install", "metallb", chart, "-n", Namespace,
				"--create-namespace", "--set", "frrk8s.enabled=false", "--wait", "--timeout", "3m"); err != nil {
				return fmt.Errorf("installing MetalLB with Helm: %w\n%s", err, out)
			}
			return e.waitReady(ctx, 3*time.Minute)
		},
		uninstall: func(e *Env, ctx context.Context) error {
			if out, err := e.run(ctx, e.Helm, "--kubeconfig", e.Kubeconfig, "uninstall", "metallb", "-n", Namespace, "--wait", "--ignore-not-found"); err != nil {
				return fmt.Errorf("helm uninstall metallb: %w\n%s", err, out)
			}
			// The CRDs of a release the migration removed are no longer the release's.
			crds := []string{"bfdprofiles", "bgpadvertisements", "bgppeers", "communities", "configurationstates",
				"ipaddresspools", "l2advertisements", "servicebgpstatuses", "servicel2statuses"}
			for i := range crds {
				crds[i] += ".metallb.io"
			}
			if out, err := e.kubectl(ctx, "", append([]string{"delete", "crd", "--ignore-not-found", "--wait", "--timeout=2m"}, crds...)...); err != nil {
				return fmt.Errorf("deleting MetalLB's CRDs: %w\n%s", err, out)
			}
			if out, err := e.kubectl(ctx, "", "delete", "namespace", Namespace, "--ignore-not-found", "--wait", "--timeout=3m"); err != nil {
				return fmt.Errorf("deleting namespace %s: %w\n%s", Namespace, err, out)
			}
			return nil
		},
	}
}

// migrateFromMetalLB installs mlb with the walkthrough, migrates to ironlb under traffic
// (withAbort: first prepare, install, helm uninstall --no-hooks and abort), checks the
// targets, then goes back to mlb. all: every implementation switchTo may have to remove.
func migrateFromMetalLB(t *testing.T, e *Env, mlb *lbImpl, all []*lbImpl, withAbort bool) {
	e.switchTo(t, mlb, all)
	ctx := ctxT(t)
	dumpOnFailure(t, e, func() []string { return nil })

	ips := applyWalkthrough(t, e)
	macs, err := e.nodeMACs(ctx)
	if err != nil {
		t.Fatal(err)
	}
	announcer := map[string]string{}
	for i, s := range walkthroughServices {
		announcer[s] = e.waitAnnouncer(t, "default", s, "")
		t.Logf("MetalLB: %s %s announced from %s (%s)", s, ips[i], announcer[s], macs[announcer[s]])
	}

	plugin := e.buildPlugin(t)
	migrate := func(args ...string) string {
		t.Helper()
		args = append([]string{"migrate-from-metallb"}, args...)
		out, err := e.run(ctx, plugin, append(args, "--kubeconfig", e.Kubeconfig, "--namespace", Namespace,
			"--chart", filepath.Join(e.Root, "charts", "ironlb"), "--timeout", "4m")...)
		t.Logf("kubectl ironlb %s:\n%s", strings.Join(args, " "), out)
		if err != nil {
			t.Fatalf("kubectl ironlb %s: %v", strings.Join(args, " "), err)
		}
		return out
	}
	plan := migrate()
	how := "(its manifests)"
	if strings.Contains(mlb.name, "Helm") {
		how = "(Helm release metallb)"
	}
	for _, want := range []string{how, "layer 2 only", "default/svc1", "scale Deployment " + mlb.controller + " to 0", "helm install ironlb"} {
		if !strings.Contains(plan, want) {
			t.Errorf("the dry run does not say %q", want)
		}
	}

	// The clients: keep-alive connections to every IP, new connections to svc2 every
	// 20 ms (the others every 500 ms: mypc has two cores), ARP for every IP every 50 ms.
	traffic := map[string]*traffic{}
	arps := map[string]*clientLoop{}
	for i, s := range walkthroughServices {
		every := 500 * time.Millisecond
		if s == "svc2" {
			every = 20 * time.Millisecond
		}
		traffic[s] = e.startTrafficEvery(t, ips[i], every)
		arps[s] = e.runProbe("--arp", ips[i], "--interval", "50ms")
	}
	start := time.Now()

	// prepare, then the helm install it prints.
	prepare := func() {
		t.Helper()
		var helmLine string
		for l := range strings.Lines(migrate("prepare")) {
			if l = strings.TrimSpace(l); strings.HasPrefix(l, "helm install ") {
				helmLine = l
			}
		}
		if helmLine == "" {
			t.Fatal("prepare printed no helm install command")
		}
		helmArgs := append(strings.Fields(helmLine)[1:], "--kubeconfig", e.Kubeconfig, "--timeout", "3m")
		if out, err := e.run(ctx, e.Helm, helmArgs...); err != nil {
			t.Fatalf("%s: %v\n%s", helmLine, err, out)
		}
	}
	if withAbort {
		// First the way back before finish: ironlb out without its cleanup hook, MetalLB's
		// controller and webhooks restored.
		prepare()
		if out, err := e.run(ctx, e.Helm, "--kubeconfig", e.Kubeconfig, "uninstall", Release, "-n", Namespace, "--no-hooks", "--wait"); err != nil {
			t.Fatalf("helm uninstall --no-hooks: %v\n%s", err, out)
		}
		migrate("abort")
		if err := e.waitReady(ctx, 3*time.Minute); err != nil { // e.Impl is MetalLB
			t.Fatal(err)
		}
	}
	// Then for good.
	prepare()
	migrate("finish")
	if strings.Contains(mlb.name, "Helm") {
		// finish removed MetalLB's release, record included (helm uninstall would have
		// deleted the CRDs and the pools).
		if out, err := e.run(ctx, e.Helm, "--kubeconfig", e.Kubeconfig, "status", "metallb", "-n", Namespace); err == nil {
			t.Errorf("MetalLB's Helm release is still recorded after finish:\n%s", out)
		}
	}
	e.Impl = ironlbImpl
	end := time.Now()
	// Observation window: the clients keep going after MetalLB is gone.
	time.Sleep(3 * time.Second)

	for i, s := range walkthroughServices {
		what := fmt.Sprintf("%s (%s) during the migration", s, ips[i])
		requireUnbroken(t, what, traffic[s].stop(t))
		arps[s].finish(t)
		checkOnlyAnnouncer(t, what, probe.ParseARP(arps[s].res.Stdout), macs[announcer[s]], start, end.Add(3*time.Second))
	}
	for i, s := range walkthroughServices {
		if ip := e.waitIngressIP(t, "default", s); ip != ips[i] {
			t.Errorf("%s: IP %s after the migration, %s before", s, ip, ips[i])
		}
		e.waitAnnouncer(t, "default", s, announcer[s])
	}
	var ds appsv1.DaemonSet
	if err := e.C.Get(ctx, client.ObjectKey{Namespace: Namespace, Name: mlb.speaker}, &ds); !apierrors.IsNotFound(err) {
		t.Errorf("MetalLB's speaker DaemonSet is still there after finish (err %v)", err)
	}
	if out, err := e.kubectl(ctx, "", "get", "ipaddresspools,l2advertisements", "-n", Namespace, "-o", "name"); err != nil || !strings.Contains(out, "ipaddresspool") {
		t.Errorf("the pools are gone after the migration: %v\n%s", err, out)
	}

	// The way back (docs/migrating-from-metallb.md#going-back-to-metallb).
	if out, err := e.run(ctx, e.Helm, "--kubeconfig", e.Kubeconfig, "uninstall", Release, "-n", Namespace, "--no-hooks", "--wait"); err != nil {
		t.Fatalf("helm uninstall --no-hooks: %v\n%s", err, out)
	}
	if out, err := e.kubectl(ctx, "", "delete", "servicel2statuses", "--all", "-n", Namespace); err != nil {
		t.Fatalf("deleting ironlb's ServiceL2Status objects: %v\n%s", err, out)
	}
	e.Impl = mlb
	if err := mlb.install(e, ctx); err != nil {
		t.Fatal(err)
	}
	for i, s := range walkthroughServices {
		e.waitAnnouncer(t, "default", s, "")
		// MetalLB's controller has rebuilt its allocations by now: its speakers announce
		// only what it allocated.
		if ip := e.waitIngressIP(t, "default", s); ip != ips[i] {
			t.Errorf("%s: IP %s back on MetalLB, %s before", s, ip, ips[i])
		}
	}
	poll(t, time.Minute, "svc1 served back on MetalLB", func() (bool, string) {
		out, ok := e.curlOnce(ctx, ips[0])
		return ok, out
	})
}

// checkOnlyAnnouncer checks mypc's ARP samples of one IP from..to: every answer from mac
// (the node MetalLB announced the IP from), and no second without one (a request every 50 ms).
func checkOnlyAnnouncer(t *testing.T, what string, recs []probe.ARPRecord, mac string, from, to time.Time) {
	t.Helper()
	last, n := from, 0
	var gap time.Duration
	for _, r := range recs {
		if r.At.Before(from) || r.At.After(to) {
			continue
		}
		if r.MAC.String() != mac {
			t.Errorf("%s: %s answered at %s; only %s may", what, r.MAC, r.At.Format("15:04:05.000"), mac)
		}
		gap, last, n = max(gap, r.At.Sub(last)), r.At, n+1
	}
	gap = max(gap, to.Sub(last))
	t.Logf("%s: %d ARP answers, all from %s; longest silence %v", what, n, mac, gap.Round(time.Millisecond))
	if gap > time.Second {
		t.Errorf("%s: nobody answered ARP for %v (target: every 50 ms request answered)", what, gap.Round(time.Millisecond))
	}
}
