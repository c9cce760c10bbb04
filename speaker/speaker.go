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
	"net/http"
	"net/netip"
	"slices"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	crmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
	"sigs.k8s.io/controller-runtime/pkg/metrics/filters"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/ironlb/ironlb/api/v1beta1"
	"github.com/ironlb/ironlb/internal/configload"
	"github.com/ironlb/ironlb/internal/configstate"
	"github.com/ironlb/ironlb/internal/httpsec"
	"github.com/ironlb/ironlb/internal/layer2"
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
		Controller: config.Controller{SkipNameValidation: ptr.To(true)},
		// The speaker must stop quickly on SIGTERM; the memberlist leave
		// already happened by then.
		GracefulShutdownTimeout: ptr.To(shutdownTimeout),
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
		if n.second != nil {
			status.drains = n.second.Drains
		}
		live := newLiveness(own, n.health) // Start set it (nil without memberlist)
		srv, err := probeServer(probeAddr, live.check, canAnnounce, status)
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
	seeds := map[string][]Seed{}
	var sts v1beta1.ServiceL2StatusList
	if err := c.List(ctx, &sts); err == nil {
		// Oldest first: a Service with one slot resumes on the node of
		// its oldest record (seedClaims), the one PlanStatus keeps.
		slices.SortFunc(sts.Items, func(a, b v1beta1.ServiceL2Status) int {
			return a.CreationTimestamp.Compare(b.CreationTimestamp.Time)
		})
		for _, st := range sts.Items {
			if st.Status.Node != "" && st.Status.ServiceName != "" {
				svc := st.Status.ServiceNamespace + "/" + st.Status.ServiceName
				seeds[svc] = append(seeds[svc], Seed{Node: st.Status.Node, IPs: ParseStatusIPs(st.Annotations[v1beta1.ServiceL2StatusIPsAnnotation])})
			}
		}
	}
	own.Sync(time.Now(), seeds)
	log.Info("ownership synced: deciding and announcing", "services", len(own.ServiceKeys()), "seeds", len(seeds))
}
