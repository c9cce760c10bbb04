// Package speaker is the per-node half of ironlb: it decides, for every Service
// with an ingress IP, whether this node announces it, and drives the layer-2
// announcer and the ServiceL2Status objects accordingly.
//
// The decision is computed by pure functions (Decide, PlanStatus, and
// internal/election) from the controller-runtime cache and the memberlist; the
// reconcilers only read, compute and write once. The announcer's state changes
// only on positive information (an object seen changed or deleted in the cache,
// a member seen joining or dying): while the API server is unreachable the cache
// keeps its last content and the node keeps announcing what it owns, and
// memberlist failover still works.
package speaker

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	crmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
	"sigs.k8s.io/controller-runtime/pkg/metrics/filters"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/ironlb/ironlb/api/v1beta1"
	"github.com/ironlb/ironlb/internal/configload"
	"github.com/ironlb/ironlb/internal/configstate"
	"github.com/ironlb/ironlb/internal/election"
	"github.com/ironlb/ironlb/internal/httpsec"
	"github.com/ironlb/ironlb/internal/layer2"
	"github.com/ironlb/ironlb/internal/membership"
	"github.com/ironlb/ironlb/internal/ownership"
)

// +kubebuilder:rbac:groups="",resources=services;nodes,verbs=get;list;watch
// +kubebuilder:rbac:groups=discovery.k8s.io,resources=endpointslices,verbs=get;list;watch
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch;update
// +kubebuilder:rbac:groups="",namespace=metallb-system,resources=pods,verbs=get;list;watch
// +kubebuilder:rbac:groups=metallb.io,namespace=metallb-system,resources=ipaddresspools;l2advertisements,verbs=get;list;watch
// +kubebuilder:rbac:groups=metallb.io,namespace=metallb-system,resources=servicel2statuses,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups=metallb.io,namespace=metallb-system,resources=servicel2statuses/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=metallb.io,namespace=metallb-system,resources=configurationstates,verbs=get;list;watch;create;patch
// +kubebuilder:rbac:groups=metallb.io,namespace=metallb-system,resources=configurationstates/status,verbs=get;update;patch

// Protocol is the protocol label value and the word in nodeAssigned events.
const Protocol = "layer2"

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
		Name:              o.NodeName,
		Layer2:            o.Layer2,
		Ownership:         ownership.Options{Failback: o.Failback, Hold: o.HoldTime},
		DisableMemberlist: o.DisableMemberlist,
		Membership:        mo,
		KeyFile:           keyFile,
		LeaveGrace:        o.LeaveGrace,
	}
}

// Scheme returns the types the speaker reads and writes.
func Scheme() (*runtime.Scheme, error) {
	s := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(s); err != nil {
		return nil, err
	}
	if err := v1beta1.AddToScheme(s); err != nil {
		return nil, err
	}
	return s, nil
}

// Run runs the speaker until ctx ends. On ctx end it first leaves the
// memberlist (peers take over at once), then stops answering ARP/NDP.
func Run(ctx context.Context, opts Options) error {
	if err := opts.validate(); err != nil {
		return fmt.Errorf("speaker options: %w", err)
	}
	// The process-wide controller-runtime logger is the caller's to set
	// (once, in main); the manager gets ours explicitly.
	log := opts.Logger
	cfg := opts.RestConfig
	if cfg == nil {
		var err error
		if cfg, err = ctrl.GetConfig(); err != nil {
			return fmt.Errorf("kubeconfig: %w", err)
		}
	}
	scheme, err := Scheme()
	if err != nil {
		return err
	}
	podSelector, _ := labels.Parse(opts.MLLabels)

	nsOnly := map[string]cache.Config{opts.Namespace: {}}
	cacheOpts := cache.Options{ByObject: map[client.Object]cache.ByObject{
		&v1beta1.IPAddressPool{}:   {Namespaces: nsOnly},
		&v1beta1.L2Advertisement{}: {Namespaces: nsOnly},
		&v1beta1.ServiceL2Status{}: {Namespaces: nsOnly},
		&corev1.Pod{}:              {Namespaces: nsOnly, Label: podSelector},
		// Only this node's own ConfigurationState: N speakers watching N
		// objects each would be N² events.
		&v1beta1.ConfigurationState{}: {Namespaces: nsOnly, Field: fields.OneTermEqualSelector("metadata.name", configstate.SpeakerName(opts.NodeName))},
	}}
	metricsOpts := metricsserver.Options{BindAddress: opts.MetricsBindAddress, SecureServing: opts.MetricsSecure, TLSOpts: httpsec.TLSOpts(opts.EnableHTTP2)}
	if opts.MetricsBindAddress == "" {
		metricsOpts.BindAddress = "0"
	}
	if opts.MetricsSecure {
		metricsOpts.FilterProvider = filters.WithAuthenticationAndAuthorization
	}
	probeAddr := opts.HealthProbeBindAddress
	if probeAddr == "" {
		probeAddr = "0"
	}
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:  scheme,
		Logger:  log,
		Cache:   cacheOpts,
		Metrics: metricsOpts,
		// The speaker serves the probes itself, with its status snapshot
		// (probeServer).
		HealthProbeBindAddress: "0",
		LeaderElection:         false,
		// One manager per process in production; tests run several speakers
		// in one process, whose controllers share names.
		Controller: config.Controller{SkipNameValidation: ptr(true)},
		// The speaker must stop quickly on SIGTERM; the memberlist leave
		// already happened by then.
		GracefulShutdownTimeout: ptr(shutdownTimeout),
	})
	if err != nil {
		return fmt.Errorf("create manager: %w", err)
	}

	// The node machinery (announcer, ownership, gossip, membership, prober,
	// health); what it needs from the manager is injected. The status writer
	// and the Service reconciler read its owners, so they are built after
	// it, and before it starts: nothing enqueues a status or asks whether
	// this speaker answers before Start.
	var (
		r           *serviceReconciler
		sw          *statusWriter
		cacheSynced atomic.Bool
	)
	recorder := mgr.GetEventRecorder("ironlb-speaker")
	no := opts.nodeOptions()
	no.Registerer = crmetrics.Registry
	no.Recorder = recorder
	no.Status = func(svc string) { sw.Enqueue(svc) }
	no.NodeAddrs = func(ctx context.Context, node string) []netip.Addr { return nodeAddresses(ctx, mgr.GetClient(), node) }
	no.Answering = func() bool { return r.answers(ctx, &cacheSynced) }
	n, err := newNode(log, no)
	if err != nil {
		return err
	}
	own, m := n.own, n.metrics
	conflictRecords := newConflicts()
	sw = &statusWriter{
		Client: mgr.GetClient(), apiRead: mgr.GetAPIReader(), log: log.WithName("status"), opts: opts,
		own: own, conflicts: conflictRecords, created: map[string]string{},
	}
	r = &serviceReconciler{
		Client: mgr.GetClient(),
		log:    log.WithName("service"),
		opts:   opts,
		own:    own,
		k8s:    m.k8s,
		cfg:    configload.Loader{Metrics: m.k8s},
	}
	if err := n.Start(ctx); err != nil {
		return err
	}
	// The shutdown proper is the Stop after the manager below; this one
	// stops the node on the early returns in between.
	defer n.Stop()
	ml := n.ml

	var joined atomic.Bool
	go func() {
		if mgr.GetCache().WaitForCacheSync(ctx) {
			cacheSynced.Store(true)
		}
	}()
	if ml == nil {
		joined.Store(true)
	}
	// Ready once this speaker could take an IP over: its caches are synced,
	// it has joined its peers and learned the current owners from them. The
	// DaemonSet's rolling update waits for this before restarting the next
	// node's speaker.
	canAnnounce := func(req *http.Request) error {
		sctx, cancel := context.WithTimeout(req.Context(), 100*time.Millisecond)
		defer cancel()
		if !mgr.GetCache().WaitForCacheSync(sctx) {
			return errors.New("informer caches not synced yet")
		}
		if !joined.Load() {
			return errors.New("initial memberlist join not done yet")
		}
		if !own.Synced() {
			return errors.New("current owners not learned yet")
		}
		return nil
	}
	if err := setupIndexes(ctx, mgr.GetFieldIndexer()); err != nil {
		return err
	}
	r.indexed, sw.indexed = true, true
	if err := r.setup(mgr); err != nil {
		return err
	}
	if err := sw.setup(mgr); err != nil {
		return err
	}
	if err := setupConfigState(mgr, opts, r, sw); err != nil {
		return err
	}
	// livenessKnown feeds (or waits for) the liveness of every node; called
	// after the initial join.
	var livenessKnown func(context.Context) bool
	// survey asks the segment who answers for an address (`ironlb status`);
	// the prober of the health loop, so only with memberlist.
	var survey func(ctx context.Context, addr netip.Addr, window time.Duration) ([]layer2.SurveyAnswer, layer2.ProbeReason, error)
	if ml != nil {
		if err := (&peerReconciler{Client: mgr.GetClient(), log: log.WithName("peers"), opts: opts, ml: ml, own: own, ready: &joined}).setup(mgr); err != nil {
			return err
		}
		// Do not wait forever if peer discovery is broken: after a bound,
		// trust what memberlist has.
		go func() {
			select {
			case <-time.After(15 * time.Second):
				if !joined.Swap(true) {
					log.Info("no speaker Pods seen yet; deciding with the members known so far")
				}
			case <-ctx.Done():
			}
		}()
		livenessKnown = n.health.awaitPoll
		survey = n.prober.Survey
		if err := (&deletedNodes{Client: mgr.GetClient(), own: own}).setup(mgr); err != nil {
			return err
		}
	} else {
		rn := &readyNodes{Client: mgr.GetClient(), own: own}
		if err := rn.setup(mgr); err != nil {
			return err
		}
		livenessKnown = rn.list
	}
	go startOwnership(ctx, log, mgr, own, &joined, livenessKnown)
	if c := n.ann.Conflicts(); c != nil {
		go watchConflicts(ctx, log.WithName("conflicts"), c, own, conflictRecords, sw.Enqueue, mgr.GetClient(), recorder, opts.NodeName)
	}

	if probeAddr != "0" {
		// Last before the start: nothing returns early once it listens.
		status := &statusSource{self: opts.NodeName, own: own, ann: n.ann, ml: ml, conflicts: conflictRecords, exclusions: r.exclusions, survey: survey}
		srv, err := probeServer(probeAddr, canAnnounce, status)
		if err != nil {
			return err
		}
		if err := mgr.Add(srv); err != nil {
			_ = srv.Listener.Close() // not started: nothing else holds it
			return err
		}
	}
	log.Info("speaker starting", "node", opts.NodeName, "namespace", opts.Namespace, "memberlist", ml != nil)
	mgrErr := startManager(ctx, log, mgr.Start, shutdownTimeout+time.Second)

	// The memberlist leave began when ctx ended; the node keeps answering
	// through it and the leave grace, then goes quiet (node.Stop).
	n.Stop()
	if mgrErr != nil {
		if ctx.Err() != nil {
			// Asked to stop: a slow shutdown (e.g. reconciles waiting on an
			// unreachable API server) is not a failure of the speaker.
			log.Info("manager did not stop cleanly", "error", mgrErr.Error())
			return nil
		}
		return fmt.Errorf("manager: %w", mgrErr)
	}
	return nil
}

func ptr[T any](v T) *T { return &v }

// answers reports whether this speaker can answer for the IPs it owns, as
// far as it knows: once its caches are synced, only with a valid
// configuration (the last one that parsed). Before, it does not know yet and
// says it does, as a speaker of the previous release: a starting speaker is
// placeable as before, and one that finds no valid configuration says so as
// soon as its caches tell it.
func (r *serviceReconciler) answers(ctx context.Context, cacheSynced *atomic.Bool) bool {
	if !cacheSynced.Load() {
		return true
	}
	cfg, err := r.config(ctx)
	return err != nil || cfg != nil
}

// shutdownTimeout bounds how long the manager's runnables get to stop.
const shutdownTimeout = 5 * time.Second

// startManager runs start (the manager's Start) until ctx ends, then waits at
// most wait for it to return. controller-runtime's Start does not return when
// ctx ends before its caches have synced (the API server unreachable or RBAC
// missing since start-up): it keeps waiting for them, see
// kubernetes-sigs/controller-runtime pull request 3440. Such a speaker never
// announced anything, so the process may exit without it.
func startManager(ctx context.Context, log logr.Logger, start func(context.Context) error, wait time.Duration) error {
	done := make(chan error, 1)
	go func() { done <- start(ctx) }()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
	}
	select {
	case err := <-done:
		return err
	case <-time.After(wait):
		log.Info("manager still waiting for its caches to sync; stopping without it", "waited", wait)
		return nil
	}
}

// peerReconciler keeps the memberlist peers equal to the speaker Pods' IPs.
type peerReconciler struct {
	client.Client
	log   logr.Logger
	opts  Options
	ml    *membership.List
	own   *owners
	ready *atomic.Bool
}

func (p *peerReconciler) setup(mgr ctrl.Manager) error {
	return ctrl.NewControllerManagedBy(mgr).Named("speaker-peers").
		For(&corev1.Pod{}, builder.WithPredicates(predicate.NewPredicateFuncs(func(o client.Object) bool {
			return o.GetNamespace() == p.opts.Namespace
		}))).
		WithOptions(controller.Options{MaxConcurrentReconciles: 1}).
		Complete(p)
}

func (p *peerReconciler) Reconcile(ctx context.Context, _ reconcile.Request) (reconcile.Result, error) {
	var pods corev1.PodList
	sel, _ := labels.Parse(p.opts.MLLabels)
	if err := p.List(ctx, &pods, client.InNamespace(p.opts.Namespace), client.MatchingLabelsSelector{Selector: sel}); err != nil {
		return reconcile.Result{}, err
	}
	var addrs []string
	// Every node that runs a speaker counts in ownership's quorum, seen by
	// memberlist yet or not (ownership.Engine.SetSpeakerNodes).
	nodes := []string{p.opts.NodeName}
	for _, pod := range pods.Items {
		if pod.Spec.NodeName != "" && pod.DeletionTimestamp == nil {
			nodes = append(nodes, pod.Spec.NodeName)
		}
		if pod.Name == p.opts.PodName || pod.Status.PodIP == "" || pod.DeletionTimestamp != nil {
			continue
		}
		addrs = append(addrs, net.JoinHostPort(pod.Status.PodIP, strconv.Itoa(p.opts.MLBindPort)))
	}
	p.own.SetSpeakerNodes(nodes)
	p.ml.SetPeers(addrs) // joins synchronously the peers not yet members
	if p.ready.Load() {
		return reconcile.Result{}, nil
	}
	// The first join must reach a peer when there are any: its push/pull
	// brings the current owners, and a speaker that decided alone would
	// place every IP on itself. Speakers starting together retry until one
	// answers (Run gives up waiting after a bound).
	if members := p.ml.Members(); len(addrs) == 0 || len(members) > 1 {
		p.ready.Store(true)
		p.log.Info("initial peer join done", "peers", len(addrs), "members", members)
		return reconcile.Result{}, nil
	}
	return reconcile.Result{RequeueAfter: 250 * time.Millisecond}, nil
}

// serviceKeyFromLabels maps a ServiceL2Status to its Service.
func serviceKeyFromLabels(o client.Object) (types.NamespacedName, bool) {
	l := o.GetLabels()
	ns, name := l[v1beta1.ServiceL2StatusServiceNamespaceLabel], l[v1beta1.ServiceL2StatusServiceNameLabel]
	return types.NamespacedName{Namespace: ns, Name: name}, ns != "" && name != ""
}

// serviceKeyFromSlice maps an EndpointSlice to its Service.
func serviceKeyFromSlice(o client.Object) (types.NamespacedName, bool) {
	name := o.GetLabels()[discoveryv1.LabelServiceName]
	return types.NamespacedName{Namespace: o.GetNamespace(), Name: name}, name != ""
}

func (r *serviceReconciler) setup(mgr ctrl.Manager) error {
	one := func(f func(client.Object) (types.NamespacedName, bool)) handler.EventHandler {
		return handler.EnqueueRequestsFromMapFunc(func(_ context.Context, o client.Object) []reconcile.Request {
			if k, ok := f(o); ok {
				return []reconcile.Request{{NamespacedName: k}}
			}
			return nil
		})
	}
	all := handler.EnqueueRequestsFromMapFunc(func(ctx context.Context, _ client.Object) []reconcile.Request {
		return r.allServices(ctx)
	})
	return ctrl.NewControllerManagedBy(mgr).Named("speaker-services").
		For(&corev1.Service{}).
		Watches(&discoveryv1.EndpointSlice{}, one(serviceKeyFromSlice)).
		Watches(&corev1.Node{}, all, builder.WithPredicates(nodeChanged())).
		// Not on status updates: the controller rewrites a pool's status
		// with every allocation, and each would re-queue every Service on
		// every speaker (5,000 Services: ~90 config parses a second each).
		Watches(&v1beta1.IPAddressPool{}, all, builder.WithPredicates(configload.PoolChanged())).
		Watches(&v1beta1.L2Advertisement{}, all, builder.WithPredicates(configload.AdvertisementChanged())).
		WithOptions(controller.Options{MaxConcurrentReconciles: 4}).
		Complete(r)
}

// nodeChanged passes Node events that can change which nodes are eligible:
// labels (node selectors, exclude label) and the NetworkUnavailable
// condition, not the heartbeat-driven status churn. (Without memberlist the
// Ready condition is liveness: readyNodes follows it.)
func nodeChanged() predicate.Predicate {
	return predicate.Funcs{
		UpdateFunc: func(e eventUpdate) bool {
			o, ok1 := e.ObjectOld.(*corev1.Node)
			n, ok2 := e.ObjectNew.(*corev1.Node)
			if !ok1 || !ok2 {
				return true
			}
			return !labels.Equals(o.Labels, n.Labels) || election.NetworkUnavailable(o) != election.NetworkUnavailable(n)
		},
	}
}

// deletedNodes tells ownership when a Node object is deleted: the cluster
// shrank, and its speaker no longer counts in the quorum's membership.
type deletedNodes struct {
	client.Client
	own *owners
}

func (d *deletedNodes) setup(mgr ctrl.Manager) error {
	return ctrl.NewControllerManagedBy(mgr).Named("speaker-deleted-nodes").
		For(&corev1.Node{}, builder.WithPredicates(predicate.Funcs{
			CreateFunc:  func(event.CreateEvent) bool { return false },
			UpdateFunc:  func(event.UpdateEvent) bool { return false },
			GenericFunc: func(event.GenericEvent) bool { return false },
		})).
		WithOptions(controller.Options{MaxConcurrentReconciles: 1}).
		Complete(d)
}

func (d *deletedNodes) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	var node corev1.Node
	err := d.Get(ctx, req.NamespacedName, &node)
	switch {
	case apierrors.IsNotFound(err):
		d.own.Forget(req.Name)
	case err != nil:
		return reconcile.Result{}, err
	}
	return reconcile.Result{}, nil
}

// readyNodes is liveness without memberlist: a node whose Ready condition is
// True counts as a live speaker (failover then waits for the kubelet
// heartbeat to go stale and the node lifecycle controller to mark the node
// NotReady, about 40-50 s by default).
type readyNodes struct {
	client.Client
	own *owners
}

func (n *readyNodes) setup(mgr ctrl.Manager) error {
	return ctrl.NewControllerManagedBy(mgr).Named("speaker-ready-nodes").
		For(&corev1.Node{}, builder.WithPredicates(predicate.Funcs{
			UpdateFunc: func(e eventUpdate) bool {
				o, ok1 := e.ObjectOld.(*corev1.Node)
				nw, ok2 := e.ObjectNew.(*corev1.Node)
				return !ok1 || !ok2 || election.Ready(o) != election.Ready(nw)
			},
		})).
		WithOptions(controller.Options{MaxConcurrentReconciles: 1}).
		Complete(n)
}

func (n *readyNodes) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	var node corev1.Node
	st := ownership.SpeakerGone
	if err := n.Get(ctx, req.NamespacedName, &node); err == nil && election.Ready(&node) {
		st = ownership.SpeakerAlive
	} else if err != nil && !apierrors.IsNotFound(err) {
		return reconcile.Result{}, err
	}
	n.own.SetSpeaker(req.Name, st, time.Now())
	return reconcile.Result{}, nil
}

// list feeds the Ready state of every Node (ownership must not decide
// before); false if ctx ended first.
func (n *readyNodes) list(ctx context.Context) bool {
	var nodes corev1.NodeList
	for {
		err := n.List(ctx, &nodes)
		if err == nil {
			break
		}
		select {
		case <-ctx.Done():
			return false
		case <-time.After(100 * time.Millisecond):
		}
	}
	now := time.Now()
	for i := range nodes.Items {
		st := ownership.SpeakerGone
		if election.Ready(&nodes.Items[i]) {
			st = ownership.SpeakerAlive
		}
		n.own.SetSpeaker(nodes.Items[i].Name, st, now)
	}
	return true
}

// nodeAddresses returns a node's internal and external IPs from its Node
// object: the addresses its data path is probed on.
func nodeAddresses(ctx context.Context, c client.Reader, name string) []netip.Addr {
	var node corev1.Node
	if err := c.Get(ctx, types.NamespacedName{Name: name}, &node); err != nil {
		return nil
	}
	var out []netip.Addr
	for _, a := range node.Status.Addresses {
		if a.Type != corev1.NodeInternalIP && a.Type != corev1.NodeExternalIP {
			continue
		}
		if ip, err := netip.ParseAddr(a.Address); err == nil {
			out = append(out, ip.Unmap())
		}
	}
	return out
}

// startOwnership starts deciding once this speaker knows enough not to move
// anything by mistake: its caches are synced, it has joined its peers (the
// join's push/pull brought their claims), it has computed the inputs of the
// Services in the cache, and it has read the ServiceL2Status records as a
// last resort for keys no peer knows (a whole-cluster restart).
func startOwnership(ctx context.Context, log logr.Logger, mgr ctrl.Manager, own *owners, joined *atomic.Bool, liveness func(context.Context) bool) {
	if !mgr.GetCache().WaitForCacheSync(ctx) {
		return
	}
	for !joined.Load() {
		select {
		case <-ctx.Done():
			return
		case <-time.After(20 * time.Millisecond):
		}
	}
	if !liveness(ctx) {
		return
	}
	c := mgr.GetClient()
	var svcs corev1.ServiceList
	deadline := time.Now().Add(10 * time.Second)
	if err := c.List(ctx, &svcs); err == nil {
		for i := 0; i < len(svcs.Items) && time.Now().Before(deadline); {
			s := &svcs.Items[i]
			if s.Spec.Type != corev1.ServiceTypeLoadBalancer || own.Known(client.ObjectKeyFromObject(s).String()) {
				i++
				continue
			}
			select {
			case <-ctx.Done():
				return
			case <-time.After(20 * time.Millisecond):
			}
		}
	}
	seeds := map[string]string{}
	var sts v1beta1.ServiceL2StatusList
	if err := c.List(ctx, &sts); err == nil {
		for _, st := range sts.Items {
			if st.Status.Node != "" && st.Status.ServiceName != "" {
				seeds[st.Status.ServiceNamespace+"/"+st.Status.ServiceName] = st.Status.Node
			}
		}
	}
	own.Sync(time.Now(), seeds)
	log.Info("ownership synced: deciding and announcing", "services", len(own.ServiceKeys()), "seeds", len(seeds))
}
