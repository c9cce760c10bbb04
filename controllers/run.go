// Package controllers is the ironlb controller: it gives LoadBalancer Services an
// IP from the IPAddressPools, keeps the pools' status, creates the speakers'
// memberlist Secret and serves the validating webhooks.
//
// Run builds a controller-runtime manager around three reconcilers sharing one
// allocator (internal/allocator): config (pools, advertisements, namespace labels ->
// allocator pools), service (allocate, write status) and ipaddresspool-status. Only
// the elected leader allocates; the webhook runs on every replica.
package controllers

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"

	"github.com/go-logr/logr"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	crmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
	"sigs.k8s.io/controller-runtime/pkg/metrics/filters"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/webhook"

	"github.com/ironlb/ironlb/api/v1beta1"
	"github.com/ironlb/ironlb/internal/configstate"
	"github.com/ironlb/ironlb/internal/httpsec"
)

// Defaults, MetalLB's where MetalLB has one, so manifests and probes carry over.
const (
	DefaultMetricsPort     = 9120
	DefaultHealthProbePort = 17472
	DefaultWebhookPort     = 9443
	DefaultMemberlistName  = "ironlb-memberlist"
	DefaultServiceWorkers  = 8
	// DefaultKubeAPIQPS turns the client-side rate limiter off, as
	// controller-runtime and MetalLB do: the API server's priority and fairness
	// protects it, and at most ServiceWorkers status writes are in flight. A limit
	// of 200/s made 10,000 pending Services take 50 s however idle the API server.
	DefaultKubeAPIQPS   = -1
	DefaultKubeAPIBurst = 400
	// LeaderElectionID is the Lease (in the install namespace) the replicas compete for.
	LeaderElectionID = "ironlb-controller"
	// WebhookModeEnabled and WebhookModeDisabled are the values of Options.WebhookMode.
	WebhookModeEnabled  = "enabled"
	WebhookModeDisabled = "disabled"
)

// Options configure Run. The zero value of a port disables that listener.
type Options struct {
	// Namespace is the install namespace: IPAddressPools and L2Advertisements are
	// read only from it, and the leader Lease and memberlist Secret live in it.
	Namespace string
	// LoadBalancerClass selects the Services handled: "" means only Services
	// without spec.loadBalancerClass; otherwise only that exact class.
	LoadBalancerClass string

	// MetricsBindAddress is host:port of the metrics endpoint ("" or port 0 disables).
	MetricsBindAddress string
	// MetricsSecure serves metrics over HTTPS with Kubernetes authentication and
	// authorization (a token allowed to GET /metrics), as MetalLB >= 0.16 does.
	MetricsSecure bool
	// MetricsCertDir holds tls.crt/tls.key for the metrics endpoint; empty means a
	// self-signed certificate generated at start.
	MetricsCertDir string
	// HealthProbeBindAddress is host:port of /healthz and /readyz ("" or port 0 disables).
	HealthProbeBindAddress string
	// PprofBindAddress is host:port of Go's /debug/pprof endpoints ("" disables).
	PprofBindAddress string
	// EnableHTTP2 lets the webhook and metrics servers offer HTTP/2; off by default
	// (internal/httpsec).
	EnableHTTP2 bool

	// WebhookMode is WebhookModeEnabled or WebhookModeDisabled.
	WebhookMode string
	// WebhookPort is where the validating webhooks listen (TLS).
	WebhookPort int
	// WebhookCertDir holds the webhook serving certificate (managed by cert rotation).
	WebhookCertDir string
	// WebhookWriteCerts makes this process copy the certificate from its Secret into
	// WebhookCertDir; leave it false when the Secret is mounted there as a volume.
	WebhookWriteCerts bool
	// WebhookSecretName, WebhookServiceName and WebhookConfigurationName name the
	// objects the certificate rotation keeps up to date.
	WebhookSecretName        string
	WebhookServiceName       string
	WebhookConfigurationName string

	// MemberlistSecretName is the Secret holding the speakers' memberlist key;
	// created if missing. Empty disables.
	MemberlistSecretName string
	// DeploymentName is the controller Deployment that owns the memberlist and
	// webhook certificate Secrets the controller creates.
	DeploymentName string

	// LeaderElect enables leader election on the Lease LeaderElectionID.
	LeaderElect bool
	// ServiceWorkers is how many Services are written concurrently (decisions are
	// serialised by the allocator lock; the API writes are not).
	ServiceWorkers int
	// KubeAPIQPS and KubeAPIBurst bound the client's request rate; a negative
	// KubeAPIQPS disables the client-side limit (0 means the default).
	KubeAPIQPS   float32
	KubeAPIBurst int

	// RESTConfig is the API server connection; nil means ctrl.GetConfig().
	RESTConfig *rest.Config
	// Logger receives all logs (also controller-runtime's and client-go's).
	Logger logr.Logger
}

// Leader election and the authenticated metrics endpoint. Rules with
// namespace=metallb-system are for the install namespace, whatever its name: they
// become a Role (config/rbac), which the chart grants in the release namespace.
// +kubebuilder:rbac:groups=coordination.k8s.io,namespace=metallb-system,resources=leases,verbs=get;list;watch;create;update;patch
// +kubebuilder:rbac:groups=authentication.k8s.io,resources=tokenreviews,verbs=create
// +kubebuilder:rbac:groups=authorization.k8s.io,resources=subjectaccessreviews,verbs=create

// Scheme returns the types the controller reads and writes.
func Scheme() *runtime.Scheme {
	s := runtime.NewScheme()
	utilruntime.Must(clientgoscheme.AddToScheme(s))
	utilruntime.Must(v1beta1.AddToScheme(s))
	return s
}

// Run runs the controller until ctx is cancelled.
func Run(ctx context.Context, opts Options) error {
	if opts.Namespace == "" {
		return errors.New("the install namespace is not set (--namespace, METALLB_NAMESPACE or the pod's namespace)")
	}
	switch opts.WebhookMode {
	case WebhookModeEnabled, WebhookModeDisabled:
	case "":
		opts.WebhookMode = WebhookModeEnabled
	default:
		return fmt.Errorf("webhook mode %q: must be %q or %q", opts.WebhookMode, WebhookModeEnabled, WebhookModeDisabled)
	}
	if opts.ServiceWorkers <= 0 {
		opts.ServiceWorkers = DefaultServiceWorkers
	}
	log := opts.Logger
	ctrl.SetLogger(log)
	// rest_client_rate_limiter_duration_seconds: time requests waited for the
	// client-side limit, if one is set (--kube-api-qps).
	crmetrics.RegisterRESTClientMetrics(crmetrics.MetricRateLimiterLatency)
	klog.SetLogger(log.WithName("client-go"))

	cfg := opts.RESTConfig
	if cfg == nil {
		var err error
		if cfg, err = ctrl.GetConfig(); err != nil {
			return fmt.Errorf("loading the kubeconfig: %w", err)
		}
	}
	cfg = rest.CopyConfig(cfg)
	cfg.QPS, cfg.Burst = opts.KubeAPIQPS, opts.KubeAPIBurst
	if cfg.QPS == 0 {
		cfg.QPS = DefaultKubeAPIQPS
	}
	if cfg.Burst == 0 {
		cfg.Burst = DefaultKubeAPIBurst
	}
	cfg.UserAgent = "ironlb-controller"

	tlsOpts := httpsec.TLSOpts(opts.EnableHTTP2)
	metricsOpts := metricsserver.Options{BindAddress: disabledIfZero(opts.MetricsBindAddress), SecureServing: opts.MetricsSecure, CertDir: opts.MetricsCertDir, TLSOpts: tlsOpts}
	if opts.MetricsSecure {
		metricsOpts.FilterProvider = filters.WithAuthenticationAndAuthorization
	}
	onlyInstallNS := cache.ByObject{Namespaces: map[string]cache.Config{opts.Namespace: {}}}
	mgr, err := ctrl.NewManager(cfg, manager.Options{
		Scheme:                        Scheme(),
		Logger:                        log,
		Metrics:                       metricsOpts,
		HealthProbeBindAddress:        disabledIfZero(opts.HealthProbeBindAddress),
		PprofBindAddress:              disabledIfZero(opts.PprofBindAddress),
		LeaderElection:                opts.LeaderElect,
		LeaderElectionID:              LeaderElectionID,
		LeaderElectionNamespace:       opts.Namespace,
		LeaderElectionReleaseOnCancel: true,
		WebhookServer:                 webhook.NewServer(webhook.Options{Port: opts.WebhookPort, CertDir: opts.WebhookCertDir, TLSOpts: tlsOpts}),
		Cache: cache.Options{
			// Pools and advertisements count only in the install namespace, so
			// only those are watched; a look-alike object elsewhere has no effect.
			ByObject: map[client.Object]cache.ByObject{
				&v1beta1.IPAddressPool{}:   onlyInstallNS,
				&v1beta1.L2Advertisement{}: onlyInstallNS,
				// Only the controller's own ConfigurationState, not every speaker's.
				&v1beta1.ConfigurationState{}: {
					Namespaces: map[string]cache.Config{opts.Namespace: {}},
					Field:      fields.OneTermEqualSelector("metadata.name", configstate.ControllerName),
				},
			},
			DefaultTransform: cache.TransformStripManagedFields(),
		},
		Client: client.Options{Cache: &client.CacheOptions{
			// Read once at start; never watch every Secret or Deployment.
			DisableFor: []client.Object{&corev1.Secret{}, &appsv1.Deployment{}},
		}},
	})
	if err != nil {
		return fmt.Errorf("creating the manager: %w", err)
	}

	st := newState(log.WithName("allocator"), mgr.GetCache(), opts.Namespace, opts.LoadBalancerClass, newMetrics(crmetrics.Registry))
	rec := newOnChangeRecorder(mgr.GetEventRecorder("ironlb-controller"))
	if err := (&configReconciler{state: st, elected: mgr.Elected()}).setup(mgr); err != nil {
		return fmt.Errorf("setting up the config controller: %w", err)
	}
	if err := (&serviceReconciler{client: mgr.GetClient(), state: st, events: rec}).setup(mgr, opts.ServiceWorkers); err != nil {
		return fmt.Errorf("setting up the service controller: %w", err)
	}
	if err := (&poolStatusReconciler{client: mgr.GetClient(), state: st}).setup(mgr); err != nil {
		return fmt.Errorf("setting up the pool status controller: %w", err)
	}
	if err := setupConfigState(mgr, st, opts); err != nil {
		return fmt.Errorf("setting up the configuration state reporter: %w", err)
	}
	if err := mgr.Add(&memberlistSecret{
		reader: mgr.GetAPIReader(), client: mgr.GetClient(), log: log.WithName("memberlist-secret"),
		namespace: opts.Namespace, name: opts.MemberlistSecretName, deployment: opts.DeploymentName,
	}); err != nil {
		return fmt.Errorf("adding the memberlist secret creator: %w", err)
	}

	if err := mgr.AddHealthzCheck("ping", healthz.Ping); err != nil {
		return fmt.Errorf("adding the health check: %w", err)
	}
	if err := mgr.AddReadyzCheck("ping", healthz.Ping); err != nil {
		return fmt.Errorf("adding the readiness check: %w", err)
	}
	if opts.WebhookMode == WebhookModeEnabled {
		if err := setupWebhooks(mgr, opts); err != nil {
			return err
		}
	}

	log.Info("starting the controller", "namespace", opts.Namespace, "loadBalancerClass", opts.LoadBalancerClass,
		"webhookMode", opts.WebhookMode, "leaderElection", opts.LeaderElect, "metrics", metricsOpts.BindAddress)
	return mgr.Start(ctx)
}

// disabledIfZero maps an empty address or port 0 to controller-runtime's "0" (off).
func disabledIfZero(addr string) string {
	if addr == "" {
		return "0"
	}
	if _, port, err := net.SplitHostPort(addr); err == nil {
		if p, err := strconv.Atoi(port); err == nil && p == 0 {
			return "0"
		}
	}
	return addr
}
