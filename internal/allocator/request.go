package allocator

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/ironlb/ironlb/internal/service"
	"github.com/ironlb/ironlb/internal/textlimit"
)

// Service annotations, MetalLB-compatible; internal/service reads them.
const (
	AnnotationLoadBalancerIPs     = service.AnnotationLoadBalancerIPs
	AnnotationAddressPool         = service.AnnotationAddressPool
	AnnotationAllowSharedIP       = service.AnnotationAllowSharedIP
	AnnotationIPAllocatedFromPool = service.AnnotationIPAllocatedFromPool // written by the controller

	legacyPrefix = service.LegacyPrefix
	newPrefix    = service.Prefix
)

// Warning reasons returned by ParseService.
const (
	// WarningDeprecatedAnnotation: a legacy metallb.universe.tf/ annotation is used.
	WarningDeprecatedAnnotation = "DeprecatedAnnotation"
	// WarningDeprecatedField: spec.loadBalancerIP is used (deprecated by Kubernetes).
	WarningDeprecatedField = "DeprecatedField"
)

// Warning is something worth telling the user that does not stop allocation.
type Warning struct {
	Reason  string
	Message string
}

// Port is one service port, for sharing conflict checks: two services on one
// IP conflict only on the same (protocol, port) pair.
type Port struct {
	Protocol corev1.Protocol
	Port     int32
}

func (p Port) String() string { return string(p.Protocol) + "/" + strconv.Itoa(int(p.Port)) }

// Request is what one Service asks for, parsed from its spec and annotations.
// The allocator keeps a reference to Labels (not a copy) while the key holds
// addresses: callers must not mutate the map afterwards (informer objects
// are read-only anyway).
type Request struct {
	Namespace  string
	Labels     map[string]string     // Service labels, for serviceSelectors
	Families   []corev1.IPFamily     // from spec.ipFamilies, in order (primary first)
	Policy     corev1.IPFamilyPolicy // SingleStack (default), PreferDualStack, RequireDualStack
	IPs        []netip.Addr          // requested addresses, Count per family (or none)
	Count      int                   // addresses per family (0: 1; service.AnnotationAddressCount)
	Pool       string                // requested pool name ("" = any auto-assign pool)
	SharingKey string                // allow-shared-ip annotation value
	BackendKey string                // for sharing rules (MetalLB: selector + ETP rules)
	Ports      []Port                // {Protocol, Port} for sharing conflict checks
}

// ParseService turns a Service into a Request. Legacy annotations are
// accepted with a Warning; an unparsable annotation or field is an *Error
// (Reason InvalidAnnotation) naming the annotation and its value. The Service
// type and loadBalancerClass are the caller's business.
func ParseService(svc *corev1.Service) (Request, []Warning, error) {
	if svc == nil {
		return Request{}, nil, errorf(ReasonInvalidRequest, "", netip.Addr{}, "", "nil Service")
	}
	key := service.Key(svc)
	var warns []Warning
	req := Request{
		Namespace: svc.Namespace,
		Labels:    svc.Labels,
		Families:  slices.Clone(svc.Spec.IPFamilies),
	}
	if svc.Spec.IPFamilyPolicy != nil {
		req.Policy = *svc.Spec.IPFamilyPolicy
	}

	requested, err := service.RequestedIPs(svc)
	ipsAnn := requested.Annotation
	deprecated(&warns, ipsAnn)
	if requested.Field {
		warns = append(warns, Warning{Reason: WarningDeprecatedField, Message: fmt.Sprintf(
			"spec.loadBalancerIP is deprecated, use annotation %s", AnnotationLoadBalancerIPs)})
	}
	if err != nil {
		return Request{}, warns, invalidAnnotation(key, err)
	}
	req.IPs, req.Count = requested.IPs, requested.Count

	pool, poolAnn, err := service.RequestedPool(svc)
	deprecated(&warns, poolAnn)
	if err != nil {
		return Request{}, warns, invalidAnnotation(key, err)
	}
	req.Pool = pool
	share := service.Get(svc, AnnotationAllowSharedIP)
	deprecated(&warns, share)
	req.SharingKey = share.Value

	// MetalLB's backend key: Local services deliver to node-local endpoints,
	// so they may share an IP only with services selecting the same pods.
	if svc.Spec.ExternalTrafficPolicy == corev1.ServiceExternalTrafficPolicyLocal {
		req.BackendKey = labels.Set(svc.Spec.Selector).String()
	}
	for _, p := range svc.Spec.Ports {
		proto := p.Protocol
		if proto == "" {
			proto = corev1.ProtocolTCP
		}
		req.Ports = append(req.Ports, Port{Protocol: proto, Port: p.Port})
	}

	norm, nerr := normalize(req)
	if nerr != nil {
		nerr.Key = key
		if ipsAnn.Set {
			nerr.Message = fmt.Sprintf("annotation %s %s: %s", ipsAnn.Name, textlimit.Quote(ipsAnn.Value), nerr.Message)
		} else if svc.Spec.LoadBalancerIP != "" {
			nerr.Message = fmt.Sprintf("spec.loadBalancerIP %s: %s", textlimit.Quote(svc.Spec.LoadBalancerIP), nerr.Message)
		}
		return Request{}, warns, nerr
	}
	return norm, warns, nil
}

// deprecated records a warning when the legacy form of an annotation is present.
func deprecated(warns *[]Warning, a service.Annotation) {
	if msg := a.Deprecation(); msg != "" {
		*warns = append(*warns, Warning{Reason: WarningDeprecatedAnnotation, Message: msg})
	}
}

// invalidAnnotation turns internal/service's error into this package's:
// the message without the Service's name (the event is on the Service).
func invalidAnnotation(key string, err error) *Error {
	e := &Error{Reason: ReasonInvalidAnnotation, Key: key, Message: err.Error()}
	var se *service.Error
	if errors.As(err, &se) {
		e.IP, e.Message = se.IP, se.Message
	}
	return e
}

func familyOf(ip netip.Addr) corev1.IPFamily {
	if ip.Is4() {
		return corev1.IPv4Protocol
	}
	return corev1.IPv6Protocol
}

func otherFamily(f corev1.IPFamily) corev1.IPFamily {
	if f == corev1.IPv4Protocol {
		return corev1.IPv6Protocol
	}
	return corev1.IPv4Protocol
}

// normalize validates a Request and fills defaults: Policy SingleStack;
// Families from the requested IPs (in order) or IPv4; RequireDualStack always
// lists both families; SingleStack keeps only the first. The result's
// Families are exactly the families to allocate (or, for PreferDualStack, to
// try). Slices are copied so the allocator never aliases the caller's.
func normalize(req Request) (Request, *Error) {
	out := req
	out.Families = nil
	out.IPs = nil
	switch req.Policy {
	case "":
		out.Policy = corev1.IPFamilyPolicySingleStack
	case corev1.IPFamilyPolicySingleStack, corev1.IPFamilyPolicyPreferDualStack, corev1.IPFamilyPolicyRequireDualStack:
	default:
		return out, errorf(ReasonInvalidRequest, "", netip.Addr{}, "", "unknown ipFamilyPolicy %q", req.Policy)
	}
	for _, f := range req.Families {
		if f != corev1.IPv4Protocol && f != corev1.IPv6Protocol {
			return out, errorf(ReasonInvalidRequest, "", netip.Addr{}, "", "unknown ipFamily %q", f)
		}
		if slices.Contains(out.Families, f) {
			return out, errorf(ReasonInvalidRequest, "", netip.Addr{}, "", "ipFamily %q listed twice", f)
		}
		out.Families = append(out.Families, f)
	}
	switch {
	case req.Count == 0:
		out.Count = 1
	case req.Count < 0 || req.Count > service.MaxAddressCount:
		return out, errorf(ReasonInvalidRequest, "", netip.Addr{}, "", "want 1 to %d addresses per family, not %d", service.MaxAddressCount, req.Count)
	}
	perFamily := map[bool]int{}
	for _, ip := range req.IPs {
		if !ip.IsValid() || ip.Zone() != "" || ip.Is4In6() {
			return out, errorf(ReasonInvalidRequest, "", ip, "", "invalid requested address %q", ip)
		}
		if slices.Contains(out.IPs, ip) {
			return out, errorf(ReasonInvalidRequest, "", ip, "", "address %s requested twice", ip)
		}
		if perFamily[ip.Is4()]++; perFamily[ip.Is4()] > out.Count {
			if out.Count == 1 {
				return out, errorf(ReasonFamilyMismatch, "", ip, "",
					"at most one address per family, got %s and %s", out.IPs[slices.IndexFunc(out.IPs, func(p netip.Addr) bool { return p.Is4() == ip.Is4() })], ip)
			}
			return out, errorf(ReasonFamilyMismatch, "", ip, "", "more than %d %s addresses requested", out.Count, familyOf(ip))
		}
		out.IPs = append(out.IPs, ip)
	}
	for _, f := range []corev1.IPFamily{corev1.IPv4Protocol, corev1.IPv6Protocol} {
		if n := perFamily[f == corev1.IPv4Protocol]; n != 0 && n != out.Count {
			return out, errorf(ReasonFamilyMismatch, "", netip.Addr{}, "", "%d %s addresses requested, %d per family wanted", n, f, out.Count)
		}
	}
	if len(out.Families) == 0 {
		for _, ip := range out.IPs {
			if f := familyOf(ip); !slices.Contains(out.Families, f) {
				out.Families = append(out.Families, f)
			}
		}
		if len(out.Families) == 0 {
			out.Families = []corev1.IPFamily{corev1.IPv4Protocol}
		}
	}
	switch out.Policy {
	case corev1.IPFamilyPolicySingleStack:
		out.Families = out.Families[:1]
	case corev1.IPFamilyPolicyRequireDualStack:
		if len(out.Families) == 1 {
			out.Families = append(out.Families, otherFamily(out.Families[0]))
		}
	}
	for _, ip := range out.IPs {
		if !slices.Contains(out.Families, familyOf(ip)) {
			return out, errorf(ReasonFamilyMismatch, "", ip, "",
				"requested address %s does not match the service's ipFamilies %v (policy %s)", ip, out.Families, out.Policy)
		}
	}
	if out.Policy == corev1.IPFamilyPolicyRequireDualStack && len(out.IPs) > 0 && len(perFamily) == 1 {
		want := "one requested address per family"
		if out.Count > 1 {
			want = fmt.Sprintf("%d requested addresses per family", out.Count)
		}
		return out, errorf(ReasonFamilyMismatch, "", out.IPs[0], "",
			"ipFamilyPolicy RequireDualStack needs %s, got only %s", want, strings.Trim(fmt.Sprint(out.IPs), "[]"))
	}
	out.Ports = nil
	for _, p := range req.Ports {
		if p.Protocol == "" {
			p.Protocol = corev1.ProtocolTCP
		}
		out.Ports = append(out.Ports, p)
	}
	return out, nil
}
