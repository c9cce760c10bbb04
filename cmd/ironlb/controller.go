package main

import (
	"os"
	"os/signal"
	"runtime/debug"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/ironlb/ironlb/controllers"
	ironwebhook "github.com/ironlb/ironlb/internal/webhook"
)

// serviceAccountNamespaceFile is where a pod finds its own namespace.
const serviceAccountNamespaceFile = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"

func newControllerCommand() *cobra.Command {
	var (
		namespace, lbClass, logLevel, webhookMode, mlSecret, deployment, kubeconfig string
		metricsHost, metricsCertDir, webhookCertDir, pprofAddr                      string
		webhookSecret, webhookService, webhookConfig                                string
		metricsPort, probePort, webhookPort, workers, burst                         int
		enableHTTP2                                                                 bool
		qps                                                                         float32
		leaderElect, metricsSecure, webhookWriteCerts                               bool
	)
	cmd := &cobra.Command{
		Use:   "controller",
		Short: "Allocate LoadBalancer Service IPs from IPAddressPools (run once per cluster)",
		Long: `The controller gives every Service of type LoadBalancer (of our loadBalancerClass) an IP
from the IPAddressPools in the install namespace, writes it to status.loadBalancer.ingress and
the metallb.io/ip-allocated-from-pool annotation, reports problems as events on the Service,
keeps each pool's status (assigned/available counts, Ready condition), creates the speakers'
memberlist Secret, and serves the validating webhooks for IPAddressPool and L2Advertisement.

Run it as a Deployment; with --leader-elect (default) any number of replicas is safe: one
allocates, the others wait on the Lease "ironlb-controller" and serve webhooks. On start the
allocator is rebuilt from the IPs Services already show, so a restart never moves an IP.

Flags and environment variables are MetalLB's where MetalLB has them.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ns := firstNonEmpty(namespace, os.Getenv("METALLB_NAMESPACE"), readFile(serviceAccountNamespaceFile))
			log, err := newLogger(logLevel)
			if err != nil {
				return err
			}
			opts := controllers.Options{
				Namespace:                ns,
				LoadBalancerClass:        lbClass,
				MetricsBindAddress:       hostPort(metricsHost, metricsPort),
				MetricsSecure:            metricsSecure,
				MetricsCertDir:           metricsCertDir,
				HealthProbeBindAddress:   hostPort("", probePort),
				PprofBindAddress:         pprofAddr,
				EnableHTTP2:              enableHTTP2,
				WebhookMode:              webhookMode,
				WebhookPort:              webhookPort,
				WebhookCertDir:           webhookCertDir,
				WebhookWriteCerts:        webhookWriteCerts,
				WebhookSecretName:        webhookSecret,
				WebhookServiceName:       webhookService,
				WebhookConfigurationName: webhookConfig,
				MemberlistSecretName:     firstNonEmpty(mlSecret, os.Getenv("METALLB_ML_SECRET_NAME"), controllers.DefaultMemberlistName),
				DeploymentName:           firstNonEmpty(deployment, os.Getenv("METALLB_DEPLOYMENT")),
				LeaderElect:              leaderElect,
				ServiceWorkers:           workers,
				KubeAPIQPS:               qps,
				KubeAPIBurst:             burst,
				Logger:                   log,
			}
			if opts.RESTConfig, err = restConfig(kubeconfig); err != nil {
				return err
			}
			if os.Getenv("GOGC") == "" {
				// The cache holds every Service of the cluster; collecting at 50%
				// growth instead of 100% lowers the peak RSS for a few percent
				// more CPU (docs/benchmarks-controller.md). GOGC overrides it.
				debug.SetGCPercent(50)
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			return controllers.Run(ctx, opts)
		},
	}
	f := cmd.Flags()
	f.StringVar(&namespace, "namespace", "", "install namespace: IPAddressPools and L2Advertisements are read only from it; the leader Lease and memberlist Secret live in it (default: $METALLB_NAMESPACE, else the pod's namespace)")
	f.StringVar(&lbClass, "lb-class", "", "handle only Services with this spec.loadBalancerClass; empty handles only Services without a class (give the speaker the same value)")
	f.StringVar(&logLevel, "log-level", "info", "log verbosity: all, debug, info, warn, error or none")
	f.StringVar(&kubeconfig, "kubeconfig", "", "kubeconfig file; default: $KUBECONFIG, the in-cluster service account, then ~/.kube/config")
	f.IntVar(&metricsPort, "port", controllers.DefaultMetricsPort, "Prometheus metrics port (metallb_* and controller-runtime metrics); 0 disables")
	f.StringVar(&metricsHost, "metrics-bind-host", "", "address the metrics port listens on (default all)")
	f.BoolVar(&metricsSecure, "metrics-secure", true, "serve metrics over HTTPS and allow only clients whose token may GET /metrics (TokenReview + SubjectAccessReview), as MetalLB does; false serves plain HTTP")
	f.StringVar(&metricsCertDir, "metrics-cert-dir", "", "directory with tls.crt and tls.key for the metrics endpoint; default a self-signed certificate")
	f.IntVar(&probePort, "health-probe-port", controllers.DefaultHealthProbePort, "port of the /healthz (liveness) and /readyz (readiness) probes; 0 disables")
	f.BoolVar(&enableHTTP2, "enable-http2", false, "let the webhook and metrics servers offer HTTP/2; off because of the HTTP/2 stream-reset attacks (CVE-2023-44487, CVE-2023-39325), and HTTP/1.1 serves their clients as well")
	f.StringVar(&pprofAddr, "pprof-bind-address", "", "host:port serving Go's /debug/pprof profiles, for diagnosing CPU or memory use; empty disables")
	f.StringVar(&webhookMode, "webhook-mode", controllers.WebhookModeEnabled, "enabled: serve the validating webhooks and rotate their certificate; disabled: do not")
	f.IntVar(&webhookPort, "webhook-port", controllers.DefaultWebhookPort, "HTTPS port of the validating webhooks")
	f.StringVar(&webhookCertDir, "webhook-cert-dir", ironwebhook.DefaultCertDir, "directory the webhook server reads tls.crt and tls.key from")
	f.BoolVar(&webhookWriteCerts, "webhook-write-certs", true, "copy the rotated certificate from its Secret into --webhook-cert-dir; set false when the Secret is mounted there as a volume")
	f.StringVar(&webhookSecret, "webhook-secret", ironwebhook.DefaultSecretName, "Secret (install namespace) where the webhook CA and serving certificate are created and rotated")
	f.StringVar(&webhookService, "webhook-service", ironwebhook.DefaultServiceName, "Service (install namespace) in front of the webhooks; the certificate is issued for its DNS name")
	f.StringVar(&webhookConfig, "webhook-configuration", ironwebhook.DefaultWebhookConfigurationName, "ValidatingWebhookConfiguration whose caBundle is kept current")
	f.StringVar(&mlSecret, "ml-secret-name", "", "Secret holding the speakers' memberlist key, created with a random 32-byte key if missing (default: $METALLB_ML_SECRET_NAME, else "+controllers.DefaultMemberlistName+")")
	f.StringVar(&deployment, "deployment", "", "controller Deployment that owns the Secrets the controller creates (memberlist key, webhook certificate), so uninstalling removes them (default: $METALLB_DEPLOYMENT)")
	f.BoolVar(&leaderElect, "leader-elect", true, "elect one active replica through the Lease \""+controllers.LeaderElectionID+"\" in the install namespace; disable only when a single replica runs")
	f.IntVar(&workers, "service-workers", controllers.DefaultServiceWorkers, "Services whose status is written concurrently (allocation itself is serialised)")
	f.Float32Var(&qps, "kube-api-qps", controllers.DefaultKubeAPIQPS, "maximum sustained requests per second to the API server; negative: no client-side limit (the API server's priority and fairness applies, and at most --service-workers status writes are in flight)")
	f.IntVar(&burst, "kube-api-burst", controllers.DefaultKubeAPIBurst, "maximum burst of requests to the API server, with a positive --kube-api-qps")
	return cmd
}
