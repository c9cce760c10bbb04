package speaker

import (
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/rest"

	"github.com/ironlb/ironlb/internal/layer2"
	"github.com/ironlb/ironlb/internal/membership"
	"github.com/ironlb/ironlb/internal/ownership"
)

// DefaultSpeakerLabels selects the speaker Pods (MetalLB's METALLB_ML_LABELS
// default for a release named ironlb).
const DefaultSpeakerLabels = "app.kubernetes.io/name=ironlb,app.kubernetes.io/component=speaker"

// SecretKeyField is the memberlist Secret's data key, as in MetalLB.
const SecretKeyField = "secretkey"

// Options configure a speaker.
type Options struct {
	// NodeName is this node (METALLB_NODE_NAME); required.
	NodeName string
	// Namespace is the install namespace (METALLB_NAMESPACE): pools,
	// advertisements, ServiceL2Status and speaker Pods live there.
	Namespace string
	// PodName is this speaker's Pod (METALLB_POD_NAME): peer discovery skips
	// it, and its ConfigurationState finds the DaemonSet that owns it. Its
	// ServiceL2Status objects are owned by its Node, not the Pod, so that they
	// survive a restart (docs/architecture.md).
	PodName string
	// HostIP (METALLB_HOST) is advertised to peers when MLBindAddr is a
	// wildcard.
	HostIP string

	// DisableMemberlist: candidates are the nodes from the Node watch whose
	// Ready condition is True (failover then waits for the kubelet heartbeat
	// to go stale and the node lifecycle controller to mark the node
	// NotReady, about 40-50 s by default).
	DisableMemberlist bool
	// MLBindAddr and MLBindPort: memberlist listen address (METALLB_ML_BIND_ADDR,
	// METALLB_ML_BIND_PORT, default 7946).
	MLBindAddr string
	MLBindPort int
	// MLLabels selects the speaker Pods whose IPs are the memberlist peers
	// (METALLB_ML_LABELS).
	MLLabels string
	// MLSecretKeyPath is the mounted memberlist Secret: a directory holding
	// its secretkey file, or the file (METALLB_ML_SECRET_KEY_PATH). It is
	// read at start and re-read every 10 s so a rotated Secret, which the
	// kubelet updates in place, takes effect; the speaker needs no access to
	// Secrets. Empty: memberlist traffic is not encrypted.
	MLSecretKeyPath string
	// Membership timings; zero fields take membership.DefaultOptions.
	Membership membership.Options

	// LeaveGrace: on shutdown, how long to keep answering ARP/NDP after the
	// memberlist leave, while the deputy (or, for a node going away, the
	// new owner) takes over. Default 0 here; the command sets 500ms.
	LeaveGrace time.Duration

	// Failback: what happens to IPs that moved off a node when it can own
	// them again (ownership.FailbackNever, the default, or Immediate).
	Failback ownership.Failback
	// HoldTime: how long a node whose speaker went away keeps its IPs while
	// its kernel still answers on the segment (a speaker restart, crash or
	// freeze); another speaker answers ARP/NDP for it meanwhile. Zero: IPs
	// move as soon as the speaker is gone (MetalLB's behaviour).
	HoldTime time.Duration
	// KubeProxyHealthPort: the port of kube-proxy's health endpoint
	// (/healthz) on every node, which the node's watchers ask: a node whose
	// kube-proxy is unhealthy loses its IPs (ownerUnhealthy) and takes none
	// until it has been healthy for HealthyAfter. 0: no health checks (the
	// kernel's ARP/NDP answers alone, as before).
	KubeProxyHealthPort int
	// HealthyAfter: see DefaultHealthyAfter (zero takes it).
	HealthyAfter time.Duration
	// ProbeServices: with health checks on, the watchers also try a
	// connection to one of each owner's Services through it every 200 ms
	// (delivery.go): a kube-proxy restarting with its rules in place then
	// moves nothing, and a node whose pod network is cut loses its IPs.
	ProbeServices bool
	// DrainTimeout: after an IP moved to this node from a node that still
	// delivers (a planned move), how long the TCP connections this node
	// does not know keep going to that node (secondchance.go). Zero: no
	// forwarding, such moves reset their connections.
	DrainTimeout time.Duration
	// RebalanceRate: how many of its IPs a node may give away per minute to
	// nodes owning at least two fewer (planned moves, so the spread that
	// failures left comes back); 0: never.
	RebalanceRate int

	// Layer2 configures the announcer (GARP count and spacing, refresh,
	// excluded interfaces, test seams). Registerer and NodeName are set here.
	Layer2 layer2.Options

	// LoadBalancerClass: see Snapshot (MetalLB's --lb-class).
	LoadBalancerClass string
	// IgnoreExcludeLB: see election.Input (MetalLB's --ignore-exclude-lb).
	IgnoreExcludeLB bool

	// MetricsBindAddress: Prometheus endpoint ("0" disables), HTTPS with
	// Kubernetes authn/authz when MetricsSecure.
	MetricsBindAddress string
	MetricsSecure      bool
	// HealthProbeBindAddress serves /healthz and /readyz ("0" disables).
	HealthProbeBindAddress string
	// EnableHTTP2 lets the metrics server offer HTTP/2; off by default (internal/httpsec).
	EnableHTTP2 bool

	// RestConfig to reach the API server; nil uses controller-runtime's
	// lookup: $KUBECONFIG if set, else in-cluster, else ~/.kube/config.
	RestConfig *rest.Config
	// Logger; the zero value discards.
	Logger logr.Logger
}

func (o *Options) validate() error {
	var errs []error
	if o.NodeName == "" {
		errs = append(errs, errors.New("node name is empty (set --node-name or METALLB_NODE_NAME)"))
	}
	if o.Namespace == "" {
		errs = append(errs, errors.New("namespace is empty (set --namespace or METALLB_NAMESPACE)"))
	}
	if o.MLLabels == "" {
		o.MLLabels = DefaultSpeakerLabels
	}
	if _, err := labels.Parse(o.MLLabels); err != nil {
		errs = append(errs, fmt.Errorf("memberlist labels %q: %w", o.MLLabels, err))
	}
	if o.MLBindPort == 0 {
		o.MLBindPort = membership.DefaultPort
	}
	return errors.Join(errs...)
}

// nodeOptions returns the options of the speaker's node machinery; the
// functions that need the manager are Run's to set.
func (o *Options) nodeOptions() nodeOptions {
	mo := o.Membership
	mo.BindAddr, mo.BindPort = o.MLBindAddr, o.MLBindPort
	if ip := net.ParseIP(o.MLBindAddr); (ip == nil || ip.IsUnspecified()) && o.HostIP != "" {
		mo.AdvertiseAddr = o.HostIP
	}
	keyFile := ""
	if o.MLSecretKeyPath != "" {
		keyFile = keyFilePath(o.MLSecretKeyPath)
	}
	return nodeOptions{
		Name:   o.NodeName,
		Layer2: o.Layer2,
		Ownership: ownership.Options{Failback: o.Failback, Hold: o.HoldTime,
			// Nodes take IPs only once found delivering, when that is checked;
			// a new IP waits for a node that just joined as long as its first
			// verdict takes (healthy-after of passing checks, then a vote's
			// gossip), so that IPs present at start-up spread over the nodes.
			RequireUp: o.KubeProxyHealthPort > 0, AwaitJudgement: awaitJudgement(o.HealthyAfter)},
		KubeProxyHealthPort: o.KubeProxyHealthPort,
		HealthyAfter:        o.HealthyAfter,
		ProbeServices:       o.ProbeServices,
		DrainTimeout:        o.DrainTimeout,
		RebalanceRate:       o.RebalanceRate,
		DisableMemberlist:   o.DisableMemberlist,
		Membership:          mo,
		KeyFile:             keyFile,
		LeaveGrace:          o.LeaveGrace,
	}
}
