package controllers

import (
	"sync"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/events"

	"github.com/ironlb/ironlb/internal/textlimit"
)

// Event reasons the controller emits on Services (UpperCamel, as Kubernetes does).
const (
	ReasonIPAllocated          = "IPAllocated"
	ReasonAllocationFailed     = "AllocationFailed"
	ReasonIPWithdrawn          = "IPWithdrawn"
	ReasonDeprecatedAnnotation = "DeprecatedAnnotation"
)

// onChangeRecorder emits an event only when its message differs from the last one
// emitted with the same reason for the same object, so resyncs, requeues after pool
// changes and restarts of reconcile loops do not flood `kubectl describe` with
// repeats. The memory is per process: a new leader reports the current state once.
type onChangeRecorder struct {
	rec events.EventRecorder

	mu   sync.Mutex
	last map[string]map[string]string // object key -> reason -> message
}

func newOnChangeRecorder(rec events.EventRecorder) *onChangeRecorder {
	return &onChangeRecorder{rec: rec, last: map[string]map[string]string{}}
}

// emit records the event unless the same reason already carried this message for key.
func (r *onChangeRecorder) emit(key string, obj runtime.Object, eventType, reason, action, message string) {
	r.mu.Lock()
	byReason := r.last[key]
	if byReason == nil {
		byReason = map[string]string{}
		r.last[key] = byReason
	}
	if prev, ok := byReason[reason]; ok && prev == message {
		r.mu.Unlock()
		return
	}
	byReason[reason] = message
	r.mu.Unlock()
	// The message is passed as an argument, never as a format string: it may
	// contain user-supplied annotation values with '%' in them. It is bounded:
	// the API server refuses a longer note, and the event would be lost.
	r.rec.Eventf(obj, nil, eventType, reason, action, "%s", textlimit.Note(message, textlimit.MaxEventNote))
}

// reset forgets what was emitted for key with these reasons, so the next such event
// is emitted even if its text repeats (e.g. the same failure after a success).
func (r *onChangeRecorder) reset(key string, reasons ...string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, reason := range reasons {
		delete(r.last[key], reason)
	}
}

// forget drops all memory of key (the object is gone or no longer ours).
func (r *onChangeRecorder) forget(key string) {
	r.mu.Lock()
	delete(r.last, key)
	r.mu.Unlock()
}
