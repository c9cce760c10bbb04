// Package configload loads the configuration the way every ironlb process
// does: the controller (every replica), each speaker and each component's
// ConfigurationState reporter. It lists the IPAddressPools and
// L2Advertisements of the install namespace (and, for the controller, the
// Namespaces their serviceAllocation selects), parses them with
// internal/config only when their content changed, keeps the last valid
// configuration in effect when the newest is refused, and publishes MetalLB's
// metallb_k8s_client_config_* metrics with one meaning:
//
//   - config_loaded_bool is 1 once a configuration parsed;
//   - config_stale_bool is 1 while the newest configuration is refused and
//     an older valid one is in use (0 when none ever loaded: then
//     config_loaded_bool says so);
//   - update_errors_total grows by one per refused configuration content,
//     not per reconcile that sees it again.
//
// The watches that should trigger a load are here too (Watches and the
// predicates), so every component reloads on the same changes.
package configload

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"

	"github.com/ironlb/ironlb/api/v1beta1"
	"github.com/ironlb/ironlb/internal/config"
	"github.com/ironlb/ironlb/internal/k8smetrics"
)

// Loader holds the last parsed configuration of one process. The zero
// value is ready to use (publishing no metrics); it is safe for concurrent
// use.
type Loader struct {
	// Metrics receive the config metrics; nil: none are published. Set it
	// before the first Load.
	Metrics *k8smetrics.Metrics

	mu  sync.Mutex
	key string
	cfg *config.Config
	// problem is why the newest content was refused; nil when it parsed.
	problem error
	// sums caches each object's content fingerprint by resourceVersion: the
	// controller rewrites a pool's status with every allocation, and each of
	// those must cost neither a parse nor a fresh fingerprint.
	sums map[string]objectSum
}

// objectSum is an object's content fingerprint at one resourceVersion.
type objectSum struct{ resourceVersion, sum string }

// Read lists the configuration objects of namespace from r (a cache) and
// loads them (Load, logging to log). With namespaces false, Namespaces are not read: they
// only resolve serviceAllocation's namespace selectors, which the speaker
// does not use (nil keeps its RBAC and cache smaller). err is a failure to
// list, which says nothing about the configuration.
func (l *Loader) Read(ctx context.Context, log logr.Logger, r client.Reader, namespace string, namespaces bool) (cfg *config.Config, problem, err error) {
	var pools v1beta1.IPAddressPoolList
	var ads v1beta1.L2AdvertisementList
	// No deep copies: neither the fingerprint nor config.Parse modifies them.
	if err := r.List(ctx, &pools, client.InNamespace(namespace), client.UnsafeDisableDeepCopy); err != nil {
		return nil, nil, fmt.Errorf("listing IPAddressPools in namespace %q: %w", namespace, err)
	}
	if err := r.List(ctx, &ads, client.InNamespace(namespace), client.UnsafeDisableDeepCopy); err != nil {
		return nil, nil, fmt.Errorf("listing L2Advertisements in namespace %q: %w", namespace, err)
	}
	var nss []corev1.Namespace
	if namespaces {
		var list corev1.NamespaceList
		if err := r.List(ctx, &list, client.UnsafeDisableDeepCopy); err != nil {
			return nil, nil, fmt.Errorf("listing Namespaces: %w", err)
		}
		nss = list.Items
	}
	cfg, problem = l.Load(log, pools.Items, ads.Items, nss)
	return cfg, problem, nil
}

// Load parses pools, advertisements and namespaces, unless their content is
// what was parsed last time, and returns the configuration in effect (the
// newest valid one, nil if none ever parsed) and why the newest content was
// refused (nil when it parsed), setting the metrics (see the package doc).
// A parse that succeeds logs "configuration loaded" to log, a refusal logs
// its problem once (not again while the same problem stays).
func (l *Loader) Load(log logr.Logger, pools []v1beta1.IPAddressPool, ads []v1beta1.L2Advertisement, namespaces []corev1.Namespace) (*config.Config, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	key := l.keyLocked(pools, ads, namespaces)
	if key == l.key {
		return l.cfg, l.problem
	}
	if l.Metrics == nil {
		l.Metrics = k8smetrics.New(nil)
	}
	m := l.Metrics
	// Oldest first, as the webhook parses them: the cache lists objects in
	// no stable order, and of two conflicting objects the newer is blamed.
	pools = slices.Clone(pools)
	ads = slices.Clone(ads)
	slices.SortStableFunc(pools, func(a, b v1beta1.IPAddressPool) int { return config.OlderFirst(&a.ObjectMeta, &b.ObjectMeta) })
	slices.SortStableFunc(ads, func(a, b v1beta1.L2Advertisement) int { return config.OlderFirst(&a.ObjectMeta, &b.ObjectMeta) })
	cfg, err := config.Parse(pools, ads, namespaces)
	l.key = key
	if err != nil {
		m.UpdateErrors.Inc()
		if l.cfg != nil {
			m.ConfigStale.Set(1)
		}
		if l.problem == nil || err.Error() != l.problem.Error() {
			log.Error(err, "invalid configuration; keeping the last valid one", "haveValid", l.cfg != nil)
		}
		l.problem = err
		return l.cfg, err
	}
	l.problem = nil
	l.cfg = cfg
	m.ConfigLoaded.Set(1)
	m.ConfigStale.Set(0)
	log.Info("configuration loaded", "pools", len(cfg.Pools), "l2Advertisements", len(cfg.L2Advertisements))
	return cfg, nil
}

// keyLocked fingerprints what the configuration is parsed from, reusing the
// fingerprint of every object whose resourceVersion has not changed.
func (l *Loader) keyLocked(pools []v1beta1.IPAddressPool, ads []v1beta1.L2Advertisement, namespaces []corev1.Namespace) string {
	next := make(map[string]objectSum, len(pools)+len(ads)+len(namespaces))
	add := func(id string, m metav1.Object, content any) {
		o, ok := l.sums[id]
		if !ok || o.resourceVersion != m.GetResourceVersion() || o.resourceVersion == "" {
			raw, _ := json.Marshal(content) // plain API types: cannot fail
			h := sha256.Sum256(raw)
			o = objectSum{resourceVersion: m.GetResourceVersion(), sum: hex.EncodeToString(h[:16])}
		}
		next[id] = o
	}
	// What Parse reads: a pool's labels (advertisements select pools by
	// them) and spec, an advertisement's spec, a namespace's labels.
	for i := range pools {
		p := &pools[i]
		add("p/"+p.Name, p, struct {
			Labels map[string]string
			Spec   v1beta1.IPAddressPoolSpec
		}{p.Labels, p.Spec})
	}
	for i := range ads {
		add("a/"+ads[i].Name, &ads[i], ads[i].Spec)
	}
	for i := range namespaces {
		add("n/"+namespaces[i].Name, &namespaces[i], namespaces[i].Labels)
	}
	l.sums = next
	// In name order: the cache lists objects in no stable order, and a key
	// that followed it would re-parse on almost every reconcile.
	var b strings.Builder
	for _, id := range slices.Sorted(maps.Keys(next)) {
		fmt.Fprintf(&b, "%s/%s;", id, next[id].sum)
	}
	return b.String()
}

// PoolChanged passes the IPAddressPool events that can change the
// configuration: its spec (generation) or its labels, which
// L2Advertisements select pools by. Not status updates: the controller
// writes one with every allocation.
func PoolChanged() predicate.Predicate {
	return predicate.Or(predicate.GenerationChangedPredicate{}, predicate.LabelChangedPredicate{})
}

// AdvertisementChanged passes the L2Advertisement events that can change
// the configuration: its spec (generation).
func AdvertisementChanged() predicate.Predicate { return predicate.GenerationChangedPredicate{} }

// NamespaceChanged passes the Namespace events that can change the
// configuration: its labels, which serviceAllocation.namespaceSelectors
// select.
func NamespaceChanged() predicate.Predicate { return predicate.LabelChangedPredicate{} }

// Watches adds to b the watches that send h every change that can change
// the configuration: IPAddressPools and L2Advertisements, and with
// namespaces (a Loader that reads them) Namespaces.
func Watches(b *builder.Builder, h handler.EventHandler, namespaces bool) *builder.Builder {
	b = b.Watches(&v1beta1.IPAddressPool{}, h, builder.WithPredicates(PoolChanged())).
		Watches(&v1beta1.L2Advertisement{}, h, builder.WithPredicates(AdvertisementChanged()))
	if namespaces {
		b = b.Watches(&corev1.Namespace{}, h, builder.WithPredicates(NamespaceChanged()))
	}
	return b
}
