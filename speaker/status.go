package speaker

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/workqueue"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	"github.com/ironlb/ironlb/api/v1beta1"
)

// statusWriter keeps the ServiceL2Status objects in step with what this node
// announces. It runs behind the announcer: ownership changes are applied to
// the announcer first and queued here, so a slow or unreachable API server
// delays the status, never an announcement.
type statusWriter struct {
	client.Client
	apiRead   client.Reader
	log       logr.Logger
	opts      Options
	own       *owners
	conflicts *conflicts

	mu      sync.Mutex
	created map[string]string // service key -> the ServiceL2Status this speaker created last, until it is deleted
	owner   *metav1.OwnerReference

	queue atomic.Pointer[workqueue.TypedRateLimitingInterface[reconcile.Request]]
}

// Enqueue queues a status sync for service key ns/name; it never blocks.
// Calls before the writer started are covered by its start-up pass.
func (w *statusWriter) Enqueue(svc string) {
	q := w.queue.Load()
	if q == nil {
		return
	}
	ns, name, _ := cutKey(svc)
	(*q).Add(reconcile.Request{NamespacedName: types.NamespacedName{Namespace: ns, Name: name}})
}

func (w *statusWriter) setup(mgr ctrl.Manager) error {
	start := source.Func(func(_ context.Context, q workqueue.TypedRateLimitingInterface[reconcile.Request]) error {
		w.queue.Store(&q)
		for _, svc := range w.own.ServiceKeys() {
			w.Enqueue(svc)
		}
		return nil
	})
	return ctrl.NewControllerManagedBy(mgr).Named("speaker-status").
		Watches(&v1beta1.ServiceL2Status{}, handler.EnqueueRequestsFromMapFunc(func(_ context.Context, o client.Object) []reconcile.Request {
			if k, ok := serviceKeyFromLabels(o); ok {
				return []reconcile.Request{{NamespacedName: k}}
			}
			return nil
		})).
		WatchesRawSource(start).
		WithOptions(controller.Options{MaxConcurrentReconciles: 4}).
		Complete(w)
}

// Reconcile syncs the ServiceL2Status objects of one Service.
func (w *statusWriter) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	if !w.own.Synced() {
		// Until ownership has synced, Want says "announce nothing" for
		// every Service: acting on it, a restarted speaker deleted its own
		// records, the seeds it and its peers resume from, and an IP moved
		// after a speaker kill -9. Sync enqueues every Service it knows;
		// the requeue covers the others (records of deleted Services).
		return reconcile.Result{RequeueAfter: time.Second}, nil
	}
	svc := &corev1.Service{}
	if err := w.Get(ctx, req.NamespacedName, svc); err != nil {
		if !apierrors.IsNotFound(err) {
			return reconcile.Result{}, err
		}
		svc = nil
	}
	if err := w.syncStatus(ctx, req.NamespacedName, svc, w.own.Want(req.String())); err != nil {
		return reconcile.Result{}, err
	}
	if c, ok := w.conflicts.get(req.String()); ok {
		// Come back to clear the condition once the conflict is over.
		return reconcile.Result{RequeueAfter: time.Until(c.last.Add(conflictHold)) + time.Second}, nil
	}
	return reconcile.Result{}, nil
}

// syncStatus makes the ServiceL2Status objects of svc match the decision.
func (w *statusWriter) syncStatus(ctx context.Context, key types.NamespacedName, svc *corev1.Service, want Want) error {
	var list v1beta1.ServiceL2StatusList
	if err := w.List(ctx, &list, client.InNamespace(w.opts.Namespace), client.MatchingFields{indexService: key.String()}); err != nil {
		return fmt.Errorf("list ServiceL2Status of %s: %w", key, err)
	}
	existing := make([]*v1beta1.ServiceL2Status, 0, len(list.Items))
	for i := range list.Items {
		existing = append(existing, &list.Items[i])
	}
	// The cache may not show an object created a moment ago: fetch it
	// directly rather than create a duplicate. Whether cached or fetched, it
	// is the one to keep: the cache may still show older objects that were
	// deleted (PlanStatus).
	w.mu.Lock()
	createdName := w.created[key.String()]
	w.mu.Unlock()
	if createdName != "" && !slices.ContainsFunc(existing, func(s *v1beta1.ServiceL2Status) bool { return s.Name == createdName }) {
		var st v1beta1.ServiceL2Status
		err := w.apiRead.Get(ctx, types.NamespacedName{Namespace: w.opts.Namespace, Name: createdName}, &st)
		switch {
		case err == nil:
			existing = append(existing, &st)
		case apierrors.IsNotFound(err):
			w.forgetCreated(key.String())
			createdName = ""
		default:
			return fmt.Errorf("get ServiceL2Status %s: %w", createdName, err)
		}
	}

	plan := PlanStatus(existing, w.opts.NodeName, want.Announce, createdName, w.own.KeepsStatus(key.String()))
	if svc == nil {
		gone, err := w.serviceGone(ctx, key, existing)
		if err != nil {
			return err
		}
		if gone {
			// Any speaker may clean up every leftover.
			plan = StatusPlan{Delete: existing}
		}
	}
	for _, st := range plan.Delete {
		switch err := w.Delete(ctx, st); {
		case err == nil:
			w.log.Info("deleted ServiceL2Status", "service", key.String(), "name", st.Name, "node", st.Labels[v1beta1.ServiceL2StatusNodeLabel])
		case !apierrors.IsNotFound(err):
			return fmt.Errorf("delete ServiceL2Status %s: %w", st.Name, err)
		}
		if st.Name == createdName {
			w.forgetCreated(key.String())
		}
	}
	if !want.Announce || svc == nil {
		return nil
	}

	desired := v1beta1.MetalLBServiceL2Status{
		Node:             w.opts.NodeName,
		ServiceName:      key.Name,
		ServiceNamespace: key.Namespace,
		Interfaces:       StatusInterfaces(want),
	}
	ips := StatusIPs(want)
	st := plan.Keep
	if st == nil {
		owner, err := w.ownerRef(ctx)
		if err != nil {
			return err
		}
		st = &v1beta1.ServiceL2Status{ObjectMeta: metav1.ObjectMeta{
			GenerateName: "l2-",
			Namespace:    w.opts.Namespace,
			Annotations:  map[string]string{v1beta1.ServiceL2StatusIPsAnnotation: ips},
			Labels: map[string]string{
				v1beta1.ServiceL2StatusNodeLabel:             w.opts.NodeName,
				v1beta1.ServiceL2StatusServiceNameLabel:      key.Name,
				v1beta1.ServiceL2StatusServiceNamespaceLabel: key.Namespace,
			},
		}}
		if owner != nil {
			st.OwnerReferences = []metav1.OwnerReference{*owner}
		}
		if err := w.Create(ctx, st); err != nil {
			return fmt.Errorf("create ServiceL2Status for %s: %w", key, err)
		}
		w.mu.Lock()
		w.created[key.String()] = st.Name
		w.mu.Unlock()
	} else {
		st = st.DeepCopy()
		if st.Annotations[v1beta1.ServiceL2StatusIPsAnnotation] != ips {
			// A slot moved here or away, or the Service's IPs changed.
			patch := client.MergeFrom(st.DeepCopy())
			if st.Annotations == nil {
				st.Annotations = map[string]string{}
			}
			st.Annotations[v1beta1.ServiceL2StatusIPsAnnotation] = ips
			if err := w.Patch(ctx, st, patch); err != nil {
				return fmt.Errorf("annotate ServiceL2Status %s for %s with its IPs: %w", st.Name, key, err)
			}
		}
	}
	conditions := slices.Clone(st.Status.Conditions)
	condChanged := false
	if c, ok := w.conflicts.get(key.String()); ok {
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
	if err := w.Status().Update(ctx, st); err != nil {
		return fmt.Errorf("update status of ServiceL2Status %s for %s: %w", st.Name, key, err)
	}
	return nil
}

// serviceGone confirms with the API server that a Service this speaker's
// cache does not have is gone, before it deletes other nodes' records of it.
// A cache can lag (after an API server restart one speaker's Service
// informer trailed for seconds): trusting it, that speaker deleted a new
// Service's record as fast as its announcer re-created it, 50 times a
// second. Without other nodes' records there is nothing to confirm.
func (w *statusWriter) serviceGone(ctx context.Context, key types.NamespacedName, existing []*v1beta1.ServiceL2Status) (bool, error) {
	if !slices.ContainsFunc(existing, func(s *v1beta1.ServiceL2Status) bool {
		return s.Labels[v1beta1.ServiceL2StatusNodeLabel] != w.opts.NodeName
	}) {
		return true, nil
	}
	err := w.apiRead.Get(ctx, key, &metav1.PartialObjectMetadata{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Service"}})
	switch {
	case apierrors.IsNotFound(err):
		return true, nil
	case err != nil:
		return false, fmt.Errorf("confirm that Service %s is gone: %w", key, err)
	}
	return false, nil
}

func statusEqual(a, b v1beta1.MetalLBServiceL2Status) bool {
	return a.Node == b.Node && a.ServiceName == b.ServiceName && a.ServiceNamespace == b.ServiceNamespace &&
		slices.Equal(a.Interfaces, b.Interfaces)
}

func (w *statusWriter) forgetCreated(key string) {
	w.mu.Lock()
	delete(w.created, key)
	w.mu.Unlock()
}

// ownerRef returns this node's Node object as the owner of the
// ServiceL2Status objects it writes, so they survive a restart of the
// speaker (which moves nothing) and are garbage-collected with the Node.
// MetalLB uses the speaker Pod; see docs/migrating-from-metallb.md. nil
// (logged) when the Node cannot be read.
func (w *statusWriter) ownerRef(ctx context.Context) (*metav1.OwnerReference, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.owner != nil {
		return w.owner, nil
	}
	var node corev1.Node
	if err := w.Get(ctx, types.NamespacedName{Name: w.opts.NodeName}, &node); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, nil
		}
		return nil, fmt.Errorf("get node %s (owner of ServiceL2Status): %w", w.opts.NodeName, err)
	}
	w.owner = &metav1.OwnerReference{APIVersion: "v1", Kind: "Node", Name: node.Name, UID: node.UID}
	return w.owner, nil
}
