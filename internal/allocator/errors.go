package allocator

import (
	"fmt"
	"net/netip"
)

// Reasons carried by *Error. They are UpperCamel so the controller can use
// them directly in events and metrics labels.
const (
	// ReasonInvalidAnnotation: a Service annotation or field could not be parsed.
	ReasonInvalidAnnotation = "InvalidAnnotation"
	// ReasonInvalidRequest: a Request is inconsistent (e.g. two IPv4 addresses).
	ReasonInvalidRequest = "InvalidRequest"
	// ReasonIPNotInPool: an address lies in no pool the Service may use.
	ReasonIPNotInPool = "IPNotInPool"
	// ReasonIPAlreadyInUse: an address is held by a Service that does not
	// share, or the requesting Service does not allow sharing.
	ReasonIPAlreadyInUse = "IPAlreadyInUse"
	// ReasonSharingConflict: both sides allow sharing, but keys, backends or
	// ports are incompatible.
	ReasonSharingConflict = "SharingConflict"
	// ReasonNoAvailableIPs: no usable pool has a free address.
	ReasonNoAvailableIPs = "NoAvailableIPs"
	// ReasonUnknownPool: the requested pool does not exist.
	ReasonUnknownPool = "UnknownPool"
	// ReasonPoolNotAllowed: the requested pool's serviceAllocation excludes
	// the Service (namespace or labels).
	ReasonPoolNotAllowed = "PoolNotAllowed"
	// ReasonFamilyMismatch: an address's family does not fit the Service's
	// ipFamilies / ipFamilyPolicy.
	ReasonFamilyMismatch = "FamilyMismatch"
)

// Error is the error type of this package. Message says exactly why and
// names the offending Service key, annotation, address or pool.
type Error struct {
	Reason  string
	Key     string     // namespace/name, when known
	IP      netip.Addr // the offending address, if any
	Pool    string     // the pool involved, if any
	Message string
}

// Error returns Message alone: the controller attaches it to an event on the
// Service itself, so repeating the key would be noise.
func (e *Error) Error() string { return e.Message }

func errorf(reason, key string, ip netip.Addr, pool, format string, args ...any) *Error {
	return &Error{Reason: reason, Key: key, IP: ip, Pool: pool, Message: fmt.Sprintf(format, args...)}
}
