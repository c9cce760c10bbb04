package speaker

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/workqueue"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/recorder"
	"sigs.k8s.io/controller-runtime/pkg/source"

	"github.com/ironlb/ironlb/api/v1beta1"
	"github.com/ironlb/ironlb/internal/config"
	"github.com/ironlb/ironlb/internal/election"
	"github.com/ironlb/ironlb/internal/k8smetrics"
	"github.com/ironlb/ironlb/internal/layer2"
	"github.com/ironlb/ironlb/internal/membership"
)

type eventUpdate = event.UpdateEvent

// Event reasons on the Service. nodeAssigned and announceFailed are MetalLB's.
const (
	EventNodeAssigned     = "nodeAssigned"
	EventAnnounceFailed   = "announceFailed"
	EventAddressConflict  = "AddressConflict"
	EventKernelAnswersARP = "KernelAnswersARP"
)

// announcer is what the reconciler needs from layer2.Announcer.
type announcer interface {
	SetBalancer(name string, ips []netip.Addr, interfaces []string)
	DeleteBalancer(name string)
	Interfaces() []string
	KernelARPFindings(ips []netip.Addr) ([]layer2.KernelARPFinding, error)
}

type metrics struct {
	announced    *prometheus.GaugeVec
	members      prometheus.Gauge
	ownerChanges prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		announced: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: "metallb", Subsystem: "speaker", Name: "announced",
			Help: "Services being announced from this node. This is desired state, it does not guarantee that the routing protocols have converged.",
		}, []string{"ip", "node", "protocol", "service"}),
		members: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: "ironlb", Name: "memberlist_members",
			Help: "Live memberlist members (speakers) this node sees, itself included.",
		}),
		ownerChanges: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "ironlb", Name: "owner_changes_total",
			Help: "Times this node saw the elected announcer of a Service change from one node to another.",
		}),
	}
	if reg != nil {
		for _, c := range []prometheus.Collector{m.announced, m.members, m.ownerChanges} {
			if err := reg.Register(c); err != nil {
				// A second speaker in one process (tests) shares the first's.
				if are := (prometheus.AlreadyRegisteredError{}); errors.As(err, &are) {
					switch c.(type) {
					case *prometheus.GaugeVec:
						m.announced = are.ExistingCollector.(*prometheus.GaugeVec)
					case prometheus.Gauge:
						m.members = are.ExistingCollector.(prometheus.Gauge)
					case prometheus.Counter:
						m.ownerChanges = are.ExistingCollector.(prometheus.Counter)
					}
				}
			}
		}
	}
	return m
}

// announced is what this node gave the announcer for one Service.
type announced struct {
	ips        []netip.Addr
	interfaces []string // nil = all
}

func (a announced) equal(b announced) bool {
	return slices.Equal(a.ips, b.ips) && slices.Equal(a.interfaces, b.interfaces)
}

// state is the reconciler's memory: what it announces, last winners, the
// parsed config and the ServiceL2Status objects it created and the cache may
// not show yet.
type state struct {
	mu        sync.Mutex
	announced map[string]announced
	winners   map[string]string
	created   map[string]string // service key -> ServiceL2Status name
	conflicts map[string]conflictRecord
	// unannounced is the reason last logged for a Service nobody announces,
	// so the line appears once per change of reason, not per reconcile.
	unannounced map[string]string

	cfgKey   string
	cfg      *config.Config
	cfgError string
}

func newState() *state {
	return &state{announced: map[string]announced{}, winners: map[string]string{}, created: map[string]string{},
		conflicts: map[string]conflictRecord{}, unannounced: map[string]string{}}
}

// conflictRecord is the last address conflict reported for a Service's IP.
type conflictRecord struct {
	layer2.Conflict
	last time.Time
}

// ConditionAddressConflict is the ServiceL2Status condition set while another
// host answers for an announced IP.
const ConditionAddressConflict = "AddressConflict"

// conflictHold is how long a conflict stays reported after the last frame
// seen: the announcer reports a persisting conflict at most every 10 s.
const conflictHold = time.Minute

type serviceReconciler struct {
	client.Client
	apiRead  client.Reader
	log      logr.Logger
	opts     Options
	ml       *membership.List
	ann      announcer
	recorder recorder.EventRecorder
	metrics  *metrics
	state    *state
	ready    atomic.Bool
	// indexed: the cache has the indexService index (always in Run; tests
	// with a plain client select by labels instead).
	indexed bool

	ownerMu sync.Mutex
	owner   *metav1.OwnerReference

	// queue is the controller's work queue, to re-reconcile a Service on a
	// conflict report.
	queue atomic.Pointer[workqueue.TypedRateLimitingInterface[reconcile.Request]]
}

// allServices lists every Service in the cache as requests.
func (r *serviceReconciler) allServices(ctx context.Context) []reconcile.Request {
	var svcs corev1.ServiceList
	if err := r.List(ctx, &svcs, client.UnsafeDisableDeepCopy); err != nil {
		r.log.Error(err, "listing services to re-run the election")
		return nil
	}
	out := make([]reconcile.Request, 0, len(svcs.Items))
	for i := range svcs.Items {
		if svcs.Items[i].Spec.Type == corev1.ServiceTypeLoadBalancer {
			out = append(out, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&svcs.Items[i])})
		}
	}
	return out
}

// membershipSource re-runs the election of every Service on each membership
// event (MetalLB does the same on NodeJoin/NodeLeave/NodeUpdate).
func (r *serviceReconciler) membershipSource() source.Source {
	return source.Func(func(ctx context.Context, q workqueue.TypedRateLimitingInterface[reconcile.Request]) error {
		r.queue.Store(&q)
		if r.ml == nil {
			return nil
		}
		r.metrics.members.Set(float64(len(r.ml.Members())))
		go func() {
			for {
				select {
				case <-ctx.Done():
					return
				case e := <-r.ml.Events():
					members := r.ml.Members()
					r.metrics.members.Set(float64(len(members)))
					r.log.Info("membership changed", "event", e.Type.String(), "member", e.Node, "addr", e.Addr, "members", members)
					for _, req := range r.allServices(ctx) {
						q.Add(req)
					}
				}
			}
		}()
		return nil
	})
}

// indexService indexes EndpointSlices and ServiceL2Status objects by the
// namespace/name of their Service, so a reconcile finds them without scanning
// every object (the label selector path is O(objects) per reconcile).
const indexService = "ironlb.speaker.service"

// setupIndexes registers indexService on the manager's cache.
func setupIndexes(ctx context.Context, idx client.FieldIndexer) error {
	if err := idx.IndexField(ctx, &discoveryv1.EndpointSlice{}, indexService, func(o client.Object) []string {
		if k, ok := serviceKeyFromSlice(o); ok {
			return []string{k.String()}
		}
		return nil
	}); err != nil {
		return fmt.Errorf("index EndpointSlices by service: %w", err)
	}
	if err := idx.IndexField(ctx, &v1beta1.ServiceL2Status{}, indexService, func(o client.Object) []string {
		if k, ok := serviceKeyFromLabels(o); ok {
			return []string{k.String()}
		}
		return nil
	}); err != nil {
		return fmt.Errorf("index ServiceL2Status by service: %w", err)
	}
	return nil
}

// snapshot gathers the cluster-wide election inputs from the cache.
func (r *serviceReconciler) snapshot(ctx context.Context) (Snapshot, error) {
	cfg, err := r.config(ctx)
	if err != nil {
		return Snapshot{}, err
	}
	var nodes corev1.NodeList
	if err := r.List(ctx, &nodes, client.UnsafeDisableDeepCopy); err != nil {
		return Snapshot{}, fmt.Errorf("list nodes: %w", err)
	}
	s := Snapshot{
		Config:            cfg,
		Nodes:             make(map[string]*corev1.Node, len(nodes.Items)),
		Self:              r.opts.NodeName,
		LoadBalancerClass: r.opts.LoadBalancerClass,
		IgnoreExcludeLB:   r.opts.IgnoreExcludeLB,
		// Without memberlist every Node is a member; readiness is the
		// only liveness signal left.
		RequireReady: r.ml == nil,
	}
	for i := range nodes.Items {
		s.Nodes[nodes.Items[i].Name] = &nodes.Items[i]
	}
	if r.ml != nil {
		s.Members = r.ml.Members()
	} else {
		for name := range s.Nodes {
			s.Members = append(s.Members, name)
		}
	}
	return s, nil
}

// config returns the parsed configuration, re-parsing only when a pool or
// advertisement changed. An invalid configuration is logged and the last
// valid one kept, as MetalLB's speaker does.
func (r *serviceReconciler) config(ctx context.Context) (*config.Config, error) {
	var pools v1beta1.IPAddressPoolList
	var ads v1beta1.L2AdvertisementList
	// No deep copies: config.Parse does not modify its arguments.
	if err := r.List(ctx, &pools, client.InNamespace(r.opts.Namespace), client.UnsafeDisableDeepCopy); err != nil {
		return nil, fmt.Errorf("list IPAddressPools: %w", err)
	}
	if err := r.List(ctx, &ads, client.InNamespace(r.opts.Namespace), client.UnsafeDisableDeepCopy); err != nil {
		return nil, fmt.Errorf("list L2Advertisements: %w", err)
	}
	var b strings.Builder
	for _, p := range pools.Items {
		fmt.Fprintf(&b, "p/%s/%s;", p.Name, p.ResourceVersion)
	}
	for _, a := range ads.Items {
		fmt.Fprintf(&b, "a/%s/%s;", a.Name, a.ResourceVersion)
	}
	return r.state.loadConfig(r.log, b.String(), pools.Items, ads.Items), nil
}

// loadConfig parses pools and advertisements whose versions are key, unless
// key was parsed last time, and returns the configuration in effect. A failed
// parse counts as an update error and, while an older configuration stays in
// use, sets metallb_k8s_client_config_stale_bool; a good one sets
// config_loaded_bool and clears stale.
func (s *state) loadConfig(log logr.Logger, key string, pools []v1beta1.IPAddressPool, ads []v1beta1.L2Advertisement) *config.Config {
	s.mu.Lock()
	defer s.mu.Unlock()
	if key == s.cfgKey {
		return s.cfg
	}
	// Namespaces only resolve serviceAllocation selectors, which the speaker
	// does not use; nil keeps the speaker's RBAC and cache smaller.
	cfg, err := config.Parse(pools, ads, nil)
	s.cfgKey = key
	if err != nil {
		k8smetrics.UpdateErrors.Inc()
		if s.cfg != nil {
			k8smetrics.ConfigStale.Set(1)
		}
		if msg := err.Error(); msg != s.cfgError {
			log.Error(err, "invalid configuration; keeping the last valid one", "haveValid", s.cfg != nil)
			s.cfgError = msg
		}
		return s.cfg
	}
	s.cfgError = ""
	s.cfg = cfg
	k8smetrics.ConfigLoaded.Set(1)
	k8smetrics.ConfigStale.Set(0)
	log.Info("configuration loaded", "pools", len(cfg.Pools), "l2Advertisements", len(cfg.L2Advertisements))
	return cfg
}

// Reconcile decides for one Service and applies the decision; it counts in
// metallb_k8s_client_updates_total and, on error, update_errors_total.
func (r *serviceReconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	if ctx.Err() != nil || !r.ready.Load() {
		return r.reconcile(ctx, req)
	}
	k8smetrics.Updates.Inc()
	res, err := r.reconcile(ctx, req)
	if err != nil {
		k8smetrics.UpdateErrors.Inc()
	}
	return res, err
}

func (r *serviceReconciler) reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	select {
	case <-ctx.Done():
		// Shutting down: our own memberlist leave must not withdraw the IPs;
		// keep answering until the announcer stops after the leave, so
		// clients always get an answer from the old or the new owner.
		return reconcile.Result{}, nil
	default:
	}
	if !r.ready.Load() {
		// Electing with only ourselves as member would make every speaker
		// announce everything for a moment at start-up.
		return reconcile.Result{RequeueAfter: 250 * time.Millisecond}, nil
	}
	key := req.String()
	log := r.log.WithValues("service", key)

	svc := &corev1.Service{}
	if err := r.Get(ctx, req.NamespacedName, svc); err != nil {
		if !apierrors.IsNotFound(err) {
			return reconcile.Result{}, err
		}
		svc = nil
	}
	var eps []*discoveryv1.EndpointSlice
	if svc != nil {
		var list discoveryv1.EndpointSliceList
		sel := []client.ListOption{client.InNamespace(req.Namespace), client.MatchingLabels{discoveryv1.LabelServiceName: req.Name}}
		if r.indexed {
			sel = []client.ListOption{client.InNamespace(req.Namespace), client.MatchingFields{indexService: key}}
		}
		if err := r.List(ctx, &list, sel...); err != nil {
			return reconcile.Result{}, fmt.Errorf("list EndpointSlices of %s: %w", key, err)
		}
		for i := range list.Items {
			eps = append(eps, &list.Items[i])
		}
	}
	snap, err := r.snapshot(ctx)
	if err != nil {
		return reconcile.Result{}, err
	}
	want := Decide(snap, svc, eps)
	r.apply(ctx, log, key, svc, want)
	if err := r.syncStatus(ctx, req.NamespacedName, svc, want); err != nil {
		return reconcile.Result{}, err
	}
	if c, ok := r.conflict(key); ok {
		// Come back to clear the condition once the conflict is over.
		return reconcile.Result{RequeueAfter: time.Until(c.last.Add(conflictHold)) + time.Second}, nil
	}
	return reconcile.Result{}, nil
}

// conflict returns the active conflict record of a Service, dropping an
// expired one.
func (r *serviceReconciler) conflict(key string) (conflictRecord, bool) {
	r.state.mu.Lock()
	defer r.state.mu.Unlock()
	c, ok := r.state.conflicts[key]
	if ok && time.Since(c.last) > conflictHold {
		delete(r.state.conflicts, key)
		return conflictRecord{}, false
	}
	return c, ok
}

// notAnnouncedReasons are the reasons that leave a Service unannounced by
// every node and that an operator can fix (endpoints, advertisements, node
// labels or conditions, pools); they are logged at info level once per change.
// Reasons that are normal (notOwner, other class, not a LoadBalancer) or
// already reported elsewhere (noConfig: the config error) are not.
var notAnnouncedReasons = map[string]bool{
	election.ReasonNoCandidates:                true,
	election.ReasonNoMatchingAdvertisement:     true,
	election.ReasonNoReadyEndpoints:            true,
	election.ReasonSharedIPWithServiceSelector: true,
	ReasonIPNotAllowed:                         true,
	ReasonInvalidIP:                            true,
}

// apply updates the announcer, metrics, events and logs when the decision
// for key changed.
func (r *serviceReconciler) apply(ctx context.Context, log logr.Logger, key string, svc *corev1.Service, want Want) {
	self := r.opts.NodeName
	unannounced := svc != nil && want.Winner == "" && notAnnouncedReasons[want.Reason]
	r.state.mu.Lock()
	prevReason := r.state.unannounced[key]
	if unannounced {
		r.state.unannounced[key] = want.Reason
	} else {
		delete(r.state.unannounced, key)
	}
	prev, had := r.state.announced[key]
	prevWinner, hadWinner := r.state.winners[key]
	if want.Winner != "" {
		r.state.winners[key] = want.Winner
	} else if svc == nil {
		delete(r.state.winners, key)
	}
	r.state.mu.Unlock()
	if hadWinner && prevWinner != "" && want.Winner != "" && prevWinner != want.Winner {
		r.metrics.ownerChanges.Inc()
		log.Info("announcer changed", "from", prevWinner, "to", want.Winner)
	}

	if !want.Announce {
		if had {
			r.ann.DeleteBalancer(key)
			r.setAnnouncedMetric(key, prev.ips, nil)
			r.state.mu.Lock()
			delete(r.state.announced, key)
			r.state.mu.Unlock()
			log.Info("serviceWithdrawn", "reason", want.Reason, "winner", want.Winner, "ips", prev.ips)
		} else if unannounced && want.Reason != prevReason {
			// Every speaker logs this (each sees the same inputs), which
			// is what an operator looking at any one speaker needs.
			log.Info("serviceNotAnnounced: no node announces this Service", "reason", want.Reason, "ips", want.IPs, "pool", want.Pool)
		}
		return
	}

	next := announced{ips: want.IPs}
	if !want.AllInterfaces {
		next.interfaces = want.Interfaces
	}
	if had && prev.equal(next) {
		return
	}
	r.ann.SetBalancer(key, next.ips, next.interfaces)
	r.state.mu.Lock()
	r.state.announced[key] = next
	r.state.mu.Unlock()
	r.setAnnouncedMetric(key, prev.ips, next.ips)
	log.Info("serviceAnnounced", "ips", next.ips, "pool", want.Pool, "interfaces", next.interfaces)
	if svc == nil {
		return
	}
	if !had {
		// Only when this node becomes the announcer, not on every resync.
		r.recorder.Eventf(svc, nil, corev1.EventTypeNormal, EventNodeAssigned, "Announce",
			"announcing from node %q with protocol %q", self, Protocol)
	}

	if next.interfaces != nil {
		have := r.ann.Interfaces()
		if len(have) > 0 && !slices.ContainsFunc(next.interfaces, func(i string) bool { return slices.Contains(have, i) }) {
			for _, ip := range next.ips {
				r.recorder.Eventf(svc, nil, corev1.EventTypeWarning, EventAnnounceFailed, "Announce",
					"the interfaces specified by LB IP %q doesn't exist in assigned node %q with protocol %q", ip.String(), self, Protocol)
			}
			log.Info("announceFailed: none of the advertisement's interfaces exists here", "interfaces", next.interfaces, "nodeInterfaces", have)
		}
	}
	if findings, err := r.ann.KernelARPFindings(next.ips); err != nil {
		log.V(1).Info("cannot check whether the kernel answers ARP for the IPs", "error", err.Error())
	} else {
		for _, f := range findings {
			log.Info("the kernel of this node answers ARP for a load-balancer IP", "ip", f.IP, "message", f.Message)
			r.recorder.Eventf(svc, nil, corev1.EventTypeWarning, EventKernelAnswersARP, "Announce", "%s", f.Message)
		}
	}
}

func (r *serviceReconciler) setAnnouncedMetric(key string, old, next []netip.Addr) {
	for _, ip := range old {
		if !slices.Contains(next, ip) {
			r.metrics.announced.DeleteLabelValues(ip.String(), r.opts.NodeName, Protocol, key)
		}
	}
	for _, ip := range next {
		r.metrics.announced.WithLabelValues(ip.String(), r.opts.NodeName, Protocol, key).Set(1)
	}
}

// syncStatus makes the ServiceL2Status objects of svc match the decision.
func (r *serviceReconciler) syncStatus(ctx context.Context, key types.NamespacedName, svc *corev1.Service, want Want) error {
	var list v1beta1.ServiceL2StatusList
	sel := []client.ListOption{client.InNamespace(r.opts.Namespace), client.MatchingLabels{
		v1beta1.ServiceL2StatusServiceNameLabel:      key.Name,
		v1beta1.ServiceL2StatusServiceNamespaceLabel: key.Namespace,
	}}
	if r.indexed {
		sel = []client.ListOption{client.InNamespace(r.opts.Namespace), client.MatchingFields{indexService: key.String()}}
	}
	if err := r.List(ctx, &list, sel...); err != nil {
		return fmt.Errorf("list ServiceL2Status of %s: %w", key, err)
	}
	existing := make([]*v1beta1.ServiceL2Status, 0, len(list.Items))
	for i := range list.Items {
		existing = append(existing, &list.Items[i])
	}
	// The cache may not show an object created a moment ago: fetch it
	// directly rather than create a duplicate.
	r.state.mu.Lock()
	createdName := r.state.created[key.String()]
	r.state.mu.Unlock()
	if createdName != "" && !slices.ContainsFunc(existing, func(s *v1beta1.ServiceL2Status) bool { return s.Name == createdName }) {
		var st v1beta1.ServiceL2Status
		err := r.apiRead.Get(ctx, types.NamespacedName{Namespace: r.opts.Namespace, Name: createdName}, &st)
		switch {
		case err == nil:
			existing = append(existing, &st)
		case apierrors.IsNotFound(err):
			r.forgetCreated(key.String())
		default:
			return fmt.Errorf("get ServiceL2Status %s: %w", createdName, err)
		}
	}

	plan := PlanStatus(existing, r.opts.NodeName, want.Announce)
	if svc == nil {
		// The Service is gone: any speaker may clean up every leftover.
		plan = StatusPlan{Delete: existing}
	}
	for _, st := range plan.Delete {
		if err := r.Delete(ctx, st); err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("delete ServiceL2Status %s: %w", st.Name, err)
		}
		if st.Name == createdName {
			r.forgetCreated(key.String())
		}
	}
	if !want.Announce || svc == nil {
		return nil
	}

	desired := v1beta1.MetalLBServiceL2Status{
		Node:             r.opts.NodeName,
		ServiceName:      key.Name,
		ServiceNamespace: key.Namespace,
		Interfaces:       StatusInterfaces(want),
	}
	st := plan.Keep
	if st == nil {
		owner, err := r.ownerRef(ctx)
		if err != nil {
			return err
		}
		st = &v1beta1.ServiceL2Status{ObjectMeta: metav1.ObjectMeta{
			GenerateName: "l2-",
			Namespace:    r.opts.Namespace,
			Labels: map[string]string{
				v1beta1.ServiceL2StatusNodeLabel:             r.opts.NodeName,
				v1beta1.ServiceL2StatusServiceNameLabel:      key.Name,
				v1beta1.ServiceL2StatusServiceNamespaceLabel: key.Namespace,
			},
		}}
		if owner != nil {
			st.OwnerReferences = []metav1.OwnerReference{*owner}
		}
		if err := r.Create(ctx, st); err != nil {
			return fmt.Errorf("create ServiceL2Status for %s: %w", key, err)
		}
		r.state.mu.Lock()
		r.state.created[key.String()] = st.Name
		r.state.mu.Unlock()
	} else {
		st = st.DeepCopy()
	}
	conditions := slices.Clone(st.Status.Conditions)
	condChanged := false
	if c, ok := r.conflict(key.String()); ok {
		condChanged = meta.SetStatusCondition(&conditions, metav1.Condition{
			Type: ConditionAddressConflict, Status: metav1.ConditionTrue, Reason: "AnotherHostAnswers",
			ObservedGeneration: st.Generation,
			Message: fmt.Sprintf("host %s answers for %s on interface %s (last seen %s): address conflict or split brain",
				c.MAC, c.IP, c.Interface, c.last.UTC().Format(time.RFC3339)),
		})
	} else if meta.IsStatusConditionTrue(conditions, ConditionAddressConflict) {
		condChanged = meta.SetStatusCondition(&conditions, metav1.Condition{
			Type: ConditionAddressConflict, Status: metav1.ConditionFalse, Reason: "ConflictEnded",
			ObservedGeneration: st.Generation,
			Message:            fmt.Sprintf("no other host seen answering for %s", conflictHold),
		})
	}
	if statusEqual(st.Status, desired) && !condChanged {
		return nil
	}
	// node, serviceName and serviceNamespace are immutable once set; they
	// are only ever set to these values.
	st.Status.Node, st.Status.ServiceName, st.Status.ServiceNamespace = desired.Node, desired.ServiceName, desired.ServiceNamespace
	st.Status.Interfaces = desired.Interfaces
	st.Status.Conditions = conditions
	if err := r.Status().Update(ctx, st); err != nil {
		return fmt.Errorf("update status of ServiceL2Status %s for %s: %w", st.Name, key, err)
	}
	return nil
}

func statusEqual(a, b v1beta1.MetalLBServiceL2Status) bool {
	return a.Node == b.Node && a.ServiceName == b.ServiceName && a.ServiceNamespace == b.ServiceNamespace &&
		slices.Equal(a.Interfaces, b.Interfaces)
}

func (r *serviceReconciler) forgetCreated(key string) {
	r.state.mu.Lock()
	delete(r.state.created, key)
	r.state.mu.Unlock()
}

// ownerRef returns the speaker Pod as owner, nil (logged) when running
// outside a Pod.
func (r *serviceReconciler) ownerRef(ctx context.Context) (*metav1.OwnerReference, error) {
	r.ownerMu.Lock()
	defer r.ownerMu.Unlock()
	if r.owner != nil {
		return r.owner, nil
	}
	if r.opts.PodName == "" {
		return nil, nil
	}
	var pod corev1.Pod
	if err := r.apiRead.Get(ctx, types.NamespacedName{Namespace: r.opts.Namespace, Name: r.opts.PodName}, &pod); err != nil {
		return nil, fmt.Errorf("get speaker pod %s/%s (owner of ServiceL2Status): %w", r.opts.Namespace, r.opts.PodName, err)
	}
	r.owner = &metav1.OwnerReference{APIVersion: "v1", Kind: "Pod", Name: pod.Name, UID: pod.UID}
	return r.owner, nil
}

// watchConflicts turns the announcer's conflict reports into Warning events
// on the Services owning the IP.
func (r *serviceReconciler) watchConflicts(ctx context.Context) {
	conflicts := r.conflicts()
	if conflicts == nil {
		return
	}
	for {
		select {
		case <-ctx.Done():
			return
		case c := <-conflicts:
			r.state.mu.Lock()
			var keys []string
			for k, a := range r.state.announced {
				if slices.Contains(a.ips, c.IP) {
					keys = append(keys, k)
				}
			}
			r.state.mu.Unlock()
			slices.Sort(keys)
			r.state.mu.Lock()
			for _, k := range keys {
				r.state.conflicts[k] = conflictRecord{Conflict: c, last: time.Now()}
			}
			r.state.mu.Unlock()
			if q := r.queue.Load(); q != nil {
				for _, k := range keys {
					ns, name, _ := strings.Cut(k, "/")
					(*q).Add(reconcile.Request{NamespacedName: types.NamespacedName{Namespace: ns, Name: name}})
				}
			}
			r.log.Info("address conflict: another host answers for an IP this node announces",
				"ip", c.IP, "mac", c.MAC.String(), "interface", c.Interface, "services", keys)
			for _, k := range keys {
				ns, name, _ := strings.Cut(k, "/")
				var svc corev1.Service
				if err := r.Get(ctx, types.NamespacedName{Namespace: ns, Name: name}, &svc); err != nil {
					continue
				}
				r.recorder.Eventf(&svc, nil, corev1.EventTypeWarning, EventAddressConflict, "Announce",
					"node %q announces %s but host %s also answers for it on interface %s (address conflict or split brain)",
					r.opts.NodeName, c.IP, c.MAC, c.Interface)
			}
		}
	}
}

func (r *serviceReconciler) conflicts() <-chan layer2.Conflict {
	if a, ok := r.ann.(interface{ Conflicts() <-chan layer2.Conflict }); ok {
		return a.Conflicts()
	}
	return nil
}
