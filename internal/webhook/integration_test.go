package webhook_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	crwebhook "sigs.k8s.io/controller-runtime/pkg/webhook"

	"github.com/ironlb/ironlb/api/v1beta1"
	"github.com/ironlb/ironlb/internal/webhook"
)

const installNS = "metallb-system"

func repoRoot(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	return root
}

func newScheme(t *testing.T) *runtime.Scheme {
	t.Helper()
	s := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{clientgoscheme.AddToScheme, apiextensionsv1.AddToScheme, v1beta1.AddToScheme} {
		if err := add(s); err != nil {
			t.Fatal(err)
		}
	}
	return s
}

// startEnv starts a real kube-apiserver and etcd from <repo>/bin with the CRDs of
// config/crd/bases and the ValidatingWebhookConfiguration of config/webhook.
func startEnv(t *testing.T, hookOpts envtest.WebhookInstallOptions) (*envtest.Environment, *rest.Config) {
	t.Helper()
	root := repoRoot(t)
	bin := filepath.Join(root, "bin")
	for _, b := range []string{"kube-apiserver", "etcd"} {
		if _, err := os.Stat(filepath.Join(bin, b)); err != nil {
			t.Skipf("envtest needs %s/%s (build it with `make tools`): %v", bin, b, err)
		}
	}
	logf.SetLogger(testLogger(t))
	hookOpts.Paths = []string{filepath.Join(root, "config", "webhook")}
	env := &envtest.Environment{
		CRDDirectoryPaths:     []string{filepath.Join(root, "config", "crd", "bases")},
		ErrorIfCRDPathMissing: true,
		BinaryAssetsDirectory: bin,
		WebhookInstallOptions: hookOpts,
		Scheme:                newScheme(t),
	}
	cfg, err := env.Start()
	if err != nil {
		t.Fatalf("starting envtest: %v", err)
	}
	t.Cleanup(func() {
		if err := env.Stop(); err != nil {
			t.Errorf("stopping envtest: %v", err)
		}
	})
	return env, cfg
}

// testLogger sends the manager's logs to the test log, so a failure shows them, and
// drops what stray goroutines log after the test (t.Log would panic then).
func testLogger(t *testing.T) logr.Logger {
	var mu sync.Mutex
	alive := true
	t.Cleanup(func() { // Registered first, so it runs after every other cleanup.
		mu.Lock()
		alive = false
		mu.Unlock()
	})
	return funcr.New(func(prefix, args string) {
		mu.Lock()
		defer mu.Unlock()
		if alive {
			t.Log(prefix, args)
		}
	}, funcr.Options{Verbosity: 1})
}

// startManager runs mgr until the test ends and returns once its webhook server
// answers TLS handshakes.
func startManager(t *testing.T, mgr manager.Manager) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("manager: %v", err)
		}
	})
}

func waitServing(t *testing.T, mgr manager.Manager) {
	t.Helper()
	check := mgr.GetWebhookServer().StartedChecker()
	var last error
	err := wait.PollUntilContextTimeout(context.Background(), 100*time.Millisecond, 60*time.Second, true, func(context.Context) (bool, error) {
		last = check(nil)
		return last == nil, nil
	})
	if err != nil {
		t.Fatalf("webhook server not serving: %v (last check: %v)", err, last)
	}
}

func createNamespaces(t *testing.T, c client.Client, names ...string) {
	t.Helper()
	for _, n := range names {
		if err := c.Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: n}}); err != nil {
			t.Fatalf("creating namespace %s: %v", n, err)
		}
	}
}

func pool(ns, name string, addrs ...string) *v1beta1.IPAddressPool {
	return &v1beta1.IPAddressPool{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec:       v1beta1.IPAddressPoolSpec{Addresses: addrs},
	}
}

func l2(ns, name string, spec v1beta1.L2AdvertisementSpec) *v1beta1.L2Advertisement {
	return &v1beta1.L2Advertisement{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Spec: spec}
}

// mustReject checks that err is an admission/validation rejection whose message
// contains every want.
func mustReject(t *testing.T, what string, err error, want ...string) {
	t.Helper()
	if err == nil {
		t.Fatalf("%s: accepted, want rejected", what)
	}
	if !apierrors.IsForbidden(err) && !apierrors.IsInvalid(err) {
		t.Errorf("%s: error is %T %v, want a Forbidden/Invalid API error", what, err, err)
	}
	for _, w := range want {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("%s: error lacks %q:\n%v", what, w, err)
		}
	}
	t.Logf("%s: rejected as expected: %v", what, err)
}

// TestWebhooks runs the webhooks in a manager against a real API server and checks
// what users see: the walkthrough accepted, bad configuration rejected with a
// message naming object, field and value, CRD validation and printer columns.
func TestWebhooks(t *testing.T) {
	env, cfg := startEnv(t, envtest.WebhookInstallOptions{})
	hook := &env.WebhookInstallOptions
	mgr, err := manager.New(cfg, manager.Options{
		Scheme:  newScheme(t),
		Metrics: metricsserver.Options{BindAddress: "0"},
		WebhookServer: crwebhook.NewServer(crwebhook.Options{
			Host: hook.LocalServingHost, Port: hook.LocalServingPort, CertDir: hook.LocalServingCertDir,
		}),
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := webhook.Setup(mgr, installNS); err != nil {
		t.Fatal(err)
	}
	startManager(t, mgr)
	waitServing(t, mgr)

	c, err := client.New(cfg, client.Options{Scheme: newScheme(t)})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	createNamespaces(t, c, installNS, "other")

	// The walkthrough's two objects, verbatim.
	walkPool := pool(installNS, "my-ippool", "172.18.255.200-172.18.255.250")
	walkAd := l2(installNS, "my-l2-advertise", v1beta1.L2AdvertisementSpec{IPAddressPools: []string{"my-ippool"}})

	t.Run("walkthrough accepted with defaults", func(t *testing.T) {
		if err := c.Create(ctx, walkPool); err != nil {
			t.Fatalf("creating the walkthrough pool: %v", err)
		}
		if err := c.Create(ctx, walkAd); err != nil {
			t.Fatalf("creating the walkthrough L2Advertisement: %v", err)
		}
		var got v1beta1.IPAddressPool
		if err := c.Get(ctx, client.ObjectKeyFromObject(walkPool), &got); err != nil {
			t.Fatal(err)
		}
		if got.Spec.AutoAssign == nil || !*got.Spec.AutoAssign || got.Spec.AvoidBuggyIPs {
			t.Errorf("defaults: autoAssign=%v avoidBuggyIPs=%v, want true/false", got.Spec.AutoAssign, got.Spec.AvoidBuggyIPs)
		}
	})

	t.Run("overlapping pool rejected naming both pools", func(t *testing.T) {
		err := c.Create(ctx, pool(installNS, "second", "172.18.255.240/28"))
		mustReject(t, "overlapping pool", err,
			`ipaddresspoolvalidationwebhook.metallb.io`,
			`IPAddressPool "second": spec.addresses[0]: CIDR "172.18.255.240/28" in pool "second" overlaps with already defined CIDR "172.18.255.200-172.18.255.250" in pool "my-ippool"`)
	})

	t.Run("update into an overlap rejected, own change accepted", func(t *testing.T) {
		third := pool(installNS, "third", "10.1.0.0/24")
		if err := c.Create(ctx, third); err != nil {
			t.Fatal(err)
		}
		third.Spec.Addresses = []string{"10.1.0.0/24", "172.18.255.250/32"}
		mustReject(t, "update into overlap", c.Update(ctx, third),
			`CIDR "172.18.255.250/32" in pool "third" overlaps with already defined CIDR "172.18.255.200-172.18.255.250" in pool "my-ippool"`)

		// Growing a pool over its own old range is no overlap.
		var fresh v1beta1.IPAddressPool
		if err := c.Get(ctx, client.ObjectKeyFromObject(third), &fresh); err != nil {
			t.Fatal(err)
		}
		fresh.Spec.Addresses = []string{"10.1.0.0/23"}
		if err := c.Update(ctx, &fresh); err != nil {
			t.Fatalf("growing a pool over its own range: %v", err)
		}
		if err := c.Delete(ctx, &fresh); err != nil {
			t.Fatalf("delete must always be allowed: %v", err)
		}
	})

	t.Run("bad range rejected", func(t *testing.T) {
		mustReject(t, "bad range", c.Create(ctx, pool(installNS, "backwards", "172.18.0.9-172.18.0.1")),
			`IPAddressPool "backwards": spec.addresses[0]: invalid IP range "172.18.0.9-172.18.0.1": start IP "172.18.0.9" is after the end IP "172.18.0.1"`)
	})

	t.Run("the webhook, not a CEL rule, explains malformed entries", func(t *testing.T) {
		for bad, want := range map[string]string{
			"10.9.1.0/33":          `invalid CIDR "10.9.1.0/33": prefix length out of range`,
			"banana":               `invalid CIDR "banana"`,
			"10.9.1.1":             `invalid CIDR "10.9.1.1": no prefix length (write 10.9.1.1/32 for a single address)`,
			"10.9.1.1-2001:db8::1": `invalid IP range "10.9.1.1-2001:db8::1": start IP "10.9.1.1" and end IP "2001:db8::1" are of different families`,
			"fe80::1%eth0/64":      `invalid CIDR "fe80::1%eth0/64"`,
		} {
			mustReject(t, "entry "+bad, c.Create(ctx, pool(installNS, "malformed", "10.9.0.0/24", bad)),
				`IPAddressPool "malformed": spec.addresses[1]: `+want)
		}
		// What the schema accepts, the parser must accept too (same net/netip rules).
		ok := pool(installNS, "wellformed", " 10.9.0.0/24 ", "10.9.1.1 - 10.9.1.5", "2001:db8:9::/120")
		if err := c.Create(ctx, ok); err != nil {
			t.Fatalf("well-formed entries: %v", err)
		}
		if err := c.Delete(ctx, ok); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("objects outside the install namespace rejected", func(t *testing.T) {
		mustReject(t, "pool in other namespace", c.Create(ctx, pool("other", "elsewhere", "10.2.0.0/24")),
			`IPAddressPool "elsewhere" is in namespace "other": resource must be created in metallb-system namespace`)
		mustReject(t, "L2Advertisement in other namespace", c.Create(ctx, l2("other", "elsewhere", v1beta1.L2AdvertisementSpec{})),
			`resource must be created in metallb-system namespace`)
	})

	t.Run("L2Advertisement rules", func(t *testing.T) {
		mustReject(t, "duplicate pool reference", c.Create(ctx, l2(installNS, "dup", v1beta1.L2AdvertisementSpec{IPAddressPools: []string{"my-ippool", "my-ippool"}})),
			`L2Advertisement "dup": spec.ipAddressPools[1]: duplicate definition of ipAddressPools "my-ippool"`)
		bad := metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "zone", Operator: "Near"}}}
		mustReject(t, "invalid node selector", c.Create(ctx, l2(installNS, "badsel", v1beta1.L2AdvertisementSpec{NodeSelectors: []metav1.LabelSelector{bad}})),
			`L2Advertisement "badsel": spec.nodeSelectors[0]: invalid nodeSelectors`, `"Near" is not a valid label selector operator`)
		mustReject(t, "invalid preference selector", c.Create(ctx, l2(installNS, "badpref", v1beta1.L2AdvertisementSpec{
			PreferredNodeSelectors: []v1beta1.PreferredNodeSelector{{Weight: 50, Preference: bad}}})),
			`L2Advertisement "badpref": spec.preferredNodeSelectors[0].preference: invalid preference`, `"Near" is not a valid label selector operator`)
		for _, w := range []int32{0, 101} {
			mustReject(t, fmt.Sprintf("preference weight %d", w), c.Create(ctx, l2(installNS, "weight", v1beta1.L2AdvertisementSpec{
				PreferredNodeSelectors: []v1beta1.PreferredNodeSelector{{Weight: w, Preference: metav1.LabelSelector{}}}})),
				"spec.preferredNodeSelectors[0].weight")
		}
		// MetalLB's own example (design/preferred-node-l2.md shape): weights
		// summed, an empty preference allowed.
		prefer := l2(installNS, "prefer-edge", v1beta1.L2AdvertisementSpec{
			IPAddressPools: []string{"my-ippool"},
			NodeSelectors:  []metav1.LabelSelector{{MatchLabels: map[string]string{"role": "lb"}}},
			PreferredNodeSelectors: []v1beta1.PreferredNodeSelector{
				{Weight: 100, Preference: metav1.LabelSelector{MatchLabels: map[string]string{"node-role": "edge"}}},
				{Weight: 1, Preference: metav1.LabelSelector{}},
			}})
		if err := c.Create(ctx, prefer); err != nil {
			t.Errorf("an advertisement with preferredNodeSelectors must be accepted: %v", err)
		}
		// A pool that does not exist yet is fine, as in MetalLB.
		if err := c.Create(ctx, l2(installNS, "future", v1beta1.L2AdvertisementSpec{IPAddressPools: []string{"not-yet"}})); err != nil {
			t.Errorf("an advertisement naming a missing pool must be accepted: %v", err)
		}
	})

	t.Run("CRD schema rejects an empty address list", func(t *testing.T) {
		mustReject(t, "no addresses", c.Create(ctx, pool(installNS, "empty")), "spec.addresses")
	})

	t.Run("ServiceL2Status node is immutable", func(t *testing.T) {
		s := &v1beta1.ServiceL2Status{ObjectMeta: metav1.ObjectMeta{Namespace: installNS, GenerateName: "l2-"}}
		if err := c.Create(ctx, s); err != nil {
			t.Fatal(err)
		}
		s.Status = v1beta1.MetalLBServiceL2Status{Node: "myk8s-worker", ServiceName: "svc1", ServiceNamespace: "default",
			Interfaces: []v1beta1.InterfaceInfo{{Name: "eth0"}}}
		if err := c.Status().Update(ctx, s); err != nil {
			t.Fatalf("setting status: %v", err)
		}
		s.Status.Node = "myk8s-worker2"
		mustReject(t, "changing status.node", c.Status().Update(ctx, s), "status.node", "Value is immutable")
	})

	t.Run("printer columns", func(t *testing.T) {
		type col struct {
			name, path string
			priority   int32
		}
		want := map[string][]col{
			"ipaddresspools.metallb.io": {
				{"Auto Assign", ".spec.autoAssign", 0}, {"Avoid Buggy IPs", ".spec.avoidBuggyIPs", 0}, {"Addresses", ".spec.addresses", 0},
				{"Assigned IPv4", ".status.assignedIPv4", 1}, {"Available IPv4", ".status.availableIPv4", 1},
				{"Assigned IPv6", ".status.assignedIPv6", 1}, {"Available IPv6", ".status.availableIPv6", 1},
			},
			"l2advertisements.metallb.io": {
				{"IPAddressPools", ".spec.ipAddressPools", 0}, {"IPAddressPool Selectors", ".spec.ipAddressPoolSelectors", 0},
				{"Interfaces", ".spec.interfaces", 0}, {"Node Selectors", ".spec.nodeSelectors", 10},
			},
			"configurationstates.metallb.io": {
				{"Result", ".status.result", 0}, {"ErrorSummary", ".status.errorSummary", 0}, {"Age", ".metadata.creationTimestamp", 0},
			},
			"servicel2statuses.metallb.io": {
				{"Allocated Node", ".status.node", 0}, {"Service Name", ".status.serviceName", 0}, {"Service Namespace", ".status.serviceNamespace", 0},
			},
		}
		for name, cols := range want {
			var crd apiextensionsv1.CustomResourceDefinition
			if err := c.Get(ctx, client.ObjectKey{Name: name}, &crd); err != nil {
				t.Fatal(err)
			}
			if len(crd.Spec.Versions) != 1 || crd.Spec.Versions[0].Name != "v1beta1" || !crd.Spec.Versions[0].Storage ||
				crd.Spec.Versions[0].Subresources == nil || crd.Spec.Versions[0].Subresources.Status == nil {
				t.Errorf("%s: want one storage version v1beta1 with a status subresource: %+v", name, crd.Spec.Versions)
				continue
			}
			var got []col
			for _, c := range crd.Spec.Versions[0].AdditionalPrinterColumns {
				got = append(got, col{c.Name, c.JSONPath, c.Priority})
			}
			if len(got) != len(cols) {
				t.Errorf("%s: columns %v, want %v", name, got, cols)
				continue
			}
			for i := range cols {
				if got[i] != cols[i] {
					t.Errorf("%s: column %d = %v, want %v", name, i, got[i], cols[i])
				}
			}
		}
	})

	t.Run("kubectl get and explain", func(t *testing.T) {
		kubectl := filepath.Join(repoRoot(t), "bin", "kubectl")
		if _, err := os.Stat(kubectl); err != nil {
			t.Skipf("no %s (make tools builds it): %v", kubectl, err)
		}
		kubeconfig := writeKubeconfig(t, cfg)
		run := func(args ...string) string {
			t.Helper()
			out, err := exec.Command(kubectl, append([]string{"--kubeconfig", kubeconfig}, args...)...).CombinedOutput()
			if err != nil {
				t.Fatalf("kubectl %s: %v\n%s", strings.Join(args, " "), err, out)
			}
			return string(out)
		}
		// Column layout exactly as the walkthrough shows it (kubectl pads with 3 spaces).
		pools := run("get", "ipaddresspools", "-n", installNS, "--field-selector", "metadata.name=my-ippool")
		wantPools := "NAME        AUTO ASSIGN   AVOID BUGGY IPS   ADDRESSES\n" +
			"my-ippool   true          false             [\"172.18.255.200-172.18.255.250\"]\n"
		if pools != wantPools {
			t.Errorf("kubectl get ipaddresspools:\n%s\nwant:\n%s", pools, wantPools)
		}
		ads := run("get", "l2advertisements", "-n", installNS, "--field-selector", "metadata.name=my-l2-advertise")
		wantAds := "NAME              IPADDRESSPOOLS   IPADDRESSPOOL SELECTORS   INTERFACES\n" +
			"my-l2-advertise   [\"my-ippool\"]                              \n"
		if strings.TrimRight(ads, " \n") != strings.TrimRight(wantAds, " \n") {
			t.Errorf("kubectl get l2advertisements:\n%q\nwant:\n%q", ads, wantAds)
		}
		wide := run("get", "ipaddresspools", "-n", installNS, "-o", "wide")
		t.Logf("kubectl get ipaddresspools:\n%s\nkubectl get l2advertisements:\n%s\nkubectl get ipaddresspools -o wide:\n%s", pools, ads, wide)
		if !strings.Contains(strings.SplitN(wide, "\n", 2)[0], "ASSIGNED IPV4   AVAILABLE IPV4   ASSIGNED IPV6   AVAILABLE IPV6") {
			t.Errorf("kubectl get ipaddresspools -o wide lacks the usage columns:\n%s", wide)
		}
		for _, res := range []string{"ipaddresspools.metallb.io", "l2advertisements.metallb.io", "servicel2statuses.metallb.io"} {
			out := run("explain", res)
			if !strings.Contains(out, "GROUP:      metallb.io") || !strings.Contains(out, "VERSION:    v1beta1") {
				t.Errorf("kubectl explain %s lacks group/version:\n%s", res, out)
			}
		}
		out := run("explain", "ipaddresspools.spec.addresses")
		if !strings.Contains(out, "start-end") {
			t.Errorf("kubectl explain ipaddresspools.spec.addresses is not documented:\n%s", out)
		}
	})

	// Last, as it removes the webhook configuration: objects stored before the
	// webhook existed may already conflict; that must not block unrelated changes.
	t.Run("problems only in other objects are warnings", func(t *testing.T) {
		var vwc admissionregistrationv1.ValidatingWebhookConfiguration
		if err := c.Get(ctx, client.ObjectKey{Name: webhook.DefaultWebhookConfigurationName}, &vwc); err != nil {
			t.Fatal(err)
		}
		if err := c.Delete(ctx, &vwc); err != nil {
			t.Fatal(err)
		}
		// Creation times have one-second resolution: make "legacy" visibly newer.
		var first v1beta1.IPAddressPool
		if err := c.Get(ctx, client.ObjectKeyFromObject(walkPool), &first); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Until(first.CreationTimestamp.Add(1100 * time.Millisecond)))
		// The API server learns of the deleted configuration through its
		// own informer: until then it still calls the webhook, which denies.
		deadline := time.Now().Add(30 * time.Second)
		for {
			err := c.Create(ctx, pool(installNS, "legacy", "172.18.255.250/32"))
			if err == nil {
				break
			}
			if !strings.Contains(err.Error(), "admission webhook") || time.Now().After(deadline) {
				t.Fatalf("without the webhook: %v", err)
			}
			time.Sleep(100 * time.Millisecond)
		}
		v := &webhook.Validator{Reader: c, Namespace: installNS}
		warnings, err := v.ValidatePool(ctx, pool(installNS, "unrelated", "10.50.0.0/24"))
		if err != nil {
			t.Errorf("an unrelated pool was rejected for another object's problem: %v", err)
		}
		if len(warnings) != 1 || !strings.Contains(warnings[0], `CIDR "172.18.255.250/32" in pool "legacy" overlaps`) {
			t.Errorf("warnings = %q, want one naming the legacy overlap", warnings)
		}
		// Updating the conflicting pool itself is rejected until it is fixed.
		_, err = v.ValidatePool(ctx, pool(installNS, "legacy", "172.18.255.250/32", "10.51.0.0/24"))
		if err == nil || !strings.Contains(err.Error(), `pool "legacy" overlaps with already defined CIDR "172.18.255.200-172.18.255.250" in pool "my-ippool"`) {
			t.Errorf("updating the conflicting pool: %v", err)
		}
		if _, err := v.ValidatePool(ctx, pool(installNS, "legacy", "10.51.0.0/24")); err != nil {
			t.Errorf("fixing the conflicting pool was rejected: %v", err)
		}
	})
}

func writeKubeconfig(t *testing.T, cfg *rest.Config) string {
	t.Helper()
	kc := clientcmdapi.NewConfig()
	kc.Clusters["envtest"] = &clientcmdapi.Cluster{Server: cfg.Host, CertificateAuthorityData: cfg.CAData}
	kc.AuthInfos["envtest"] = &clientcmdapi.AuthInfo{ClientCertificateData: cfg.CertData, ClientKeyData: cfg.KeyData, Token: cfg.BearerToken}
	kc.Contexts["envtest"] = &clientcmdapi.Context{Cluster: "envtest", AuthInfo: "envtest"}
	kc.CurrentContext = "envtest"
	path := filepath.Join(t.TempDir(), "kubeconfig")
	if err := clientcmd.WriteToFile(*kc, path); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestCertRotation serves the webhooks with certificates made by SetupCertRotation
// (not envtest's): the API server can only call the webhook if the rotator created
// the certificate, the writer put it in CertDir and the CA was injected into the
// ValidatingWebhookConfiguration.
func TestCertRotation(t *testing.T) {
	// The API server reaches the webhook as "localhost", a name the rotator's
	// certificate can carry.
	env, cfg := startEnv(t, envtest.WebhookInstallOptions{LocalServingHostExternalName: "localhost"})
	hook := &env.WebhookInstallOptions
	c, err := client.New(cfg, client.Options{Scheme: newScheme(t)})
	if err != nil {
		t.Fatal(err)
	}
	createNamespaces(t, c, installNS)

	certDir := t.TempDir()
	mgr, err := manager.New(cfg, manager.Options{
		Scheme:  newScheme(t),
		Metrics: metricsserver.Options{BindAddress: "0"},
		WebhookServer: crwebhook.NewServer(crwebhook.Options{
			Host: hook.LocalServingHost, Port: hook.LocalServingPort, CertDir: certDir,
		}),
	})
	if err != nil {
		t.Fatal(err)
	}
	ready, err := webhook.SetupCertRotation(mgr, webhook.CertOptions{
		Namespace:     installNS,
		CertDir:       certDir,
		ExtraDNSNames: []string{"localhost"},
		WriteCertDir:  true,
	})
	if err != nil {
		t.Fatal(err)
	}
	setupErr := make(chan error, 1)
	go func() {
		<-ready
		setupErr <- webhook.Setup(mgr, installNS)
	}()
	startManager(t, mgr)

	select {
	case err := <-setupErr:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(3 * time.Minute):
		var s corev1.Secret
		getErr := c.Get(context.Background(), client.ObjectKey{Namespace: installNS, Name: webhook.DefaultSecretName}, &s)
		entries, _ := os.ReadDir(certDir)
		t.Fatalf("certificates not ready after 3 minutes; secret keys %v (get: %v), cert dir %v", keys(s.Data), getErr, entries)
	}
	waitServing(t, mgr)

	for _, f := range []string{"tls.crt", "tls.key"} {
		if _, err := os.Stat(filepath.Join(certDir, f)); err != nil {
			t.Errorf("writer did not put %s in the cert dir: %v", f, err)
		}
	}
	ctx := context.Background()
	if err := c.Create(ctx, pool(installNS, "my-ippool", "172.18.255.200-172.18.255.250")); err != nil {
		t.Fatalf("valid pool through the rotated certificate: %v", err)
	}
	err = c.Create(ctx, pool(installNS, "second", "172.18.255.240/28"))
	mustReject(t, "overlapping pool", err, `overlaps with already defined CIDR "172.18.255.200-172.18.255.250" in pool "my-ippool"`)
	if err != nil && strings.Contains(err.Error(), "x509") {
		t.Errorf("rejected for a TLS problem, not by the webhook: %v", err)
	}
}

func keys(m map[string][]byte) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}
