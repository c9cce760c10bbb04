package speaker

import (
	"context"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/recorder"

	"github.com/ironlb/ironlb/internal/layer2"
)

// ConditionAddressConflict is the ServiceL2Status condition set while another
// host answers for an announced IP.
const ConditionAddressConflict = "AddressConflict"

// conflictHold is how long a conflict stays reported after the last frame
// seen: the announcer reports a persisting conflict at most every 10 s.
const conflictHold = time.Minute

// conflictRecord is the last address conflict reported for a Service's IP.
type conflictRecord struct {
	layer2.Conflict
	last time.Time
}

// conflicts are the active conflict records by Service.
type conflicts struct {
	mu sync.Mutex
	m  map[string]conflictRecord
}

func newConflicts() *conflicts { return &conflicts{m: map[string]conflictRecord{}} }

// get returns the active record of a Service, dropping an expired one.
func (c *conflicts) get(svc string) (conflictRecord, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	r, ok := c.m[svc]
	if ok && time.Since(r.last) > conflictHold {
		delete(c.m, svc)
		return conflictRecord{}, false
	}
	return r, ok
}

func (c *conflicts) set(svc string, r conflictRecord) {
	c.mu.Lock()
	c.m[svc] = r
	c.mu.Unlock()
}

// watchConflicts turns the announcer's conflict reports into Warning events
// on the Services owning the IP and a condition on their ServiceL2Status.
func watchConflicts(ctx context.Context, log logr.Logger, reports <-chan layer2.Conflict, own *owners, cs *conflicts,
	status func(string), c client.Reader, rec recorder.EventRecorder, self string) {
	for {
		select {
		case <-ctx.Done():
			return
		case r := <-reports:
			keys := own.AnnouncingIP(r.IP)
			for _, k := range keys {
				cs.set(k, conflictRecord{Conflict: r, last: time.Now()})
				status(k)
			}
			log.Info("address conflict: another host answers for an IP this node announces",
				"ip", r.IP, "mac", r.MAC.String(), "interface", r.Interface, "services", keys)
			for _, k := range keys {
				ns, name, _ := cutKey(k)
				var svc corev1.Service
				if err := c.Get(ctx, types.NamespacedName{Namespace: ns, Name: name}, &svc); err != nil {
					continue
				}
				rec.Eventf(&svc, nil, corev1.EventTypeWarning, EventAddressConflict, "Announce",
					"node %q announces %s but host %s also answers for it on interface %s (address conflict or split brain)",
					self, r.IP, r.MAC, r.Interface)
			}
		}
	}
}

// cutKey splits a namespace/name key.
func cutKey(k string) (ns, name string, ok bool) { return strings.Cut(k, "/") }
