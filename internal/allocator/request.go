package allocator

import (
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/ironlb/ironlb/internal/textlimit"
)

// Service annotations, MetalLB-compatible. The legacy metallb.universe.tf/
// forms are still read; the metallb.io/ form wins when both are set.
const (
	AnnotationLoadBalancerIPs     = "metallb.io/loadBalancerIPs"
	AnnotationAddressPool         = "metallb.io/address-pool"
	AnnotationAllowSharedIP       = "metallb.io/allow-shared-ip"
	AnnotationIPAllocatedFromPool = "metallb.io/ip-allocated-from-pool" // written by the controller

	legacyPrefix = "metallb.universe.tf/"
	newPrefix    = "metallb.io/"
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
	IPs        []netip.Addr          // requested addresses, at most one per family
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
	key := svc.Namespace + "/" + svc.Name
	var warns []Warning
	req := Request{
		Namespace: svc.Namespace,
		Labels:    svc.Labels,
		Families:  slices.Clone(svc.Spec.IPFamilies),
	}
	if svc.Spec.IPFamilyPolicy != nil {
		req.Policy = *svc.Spec.IPFamilyPolicy
	}

	ipsName, ipsValue, ipsSet := annotation(svc, AnnotationLoadBalancerIPs, &warns)
	if ipsSet && strings.TrimSpace(ipsValue) != "" {
		ips, err := parseIPList(ipsValue)
		if err != nil {
			return Request{}, warns, errorf(ReasonInvalidAnnotation, key, netip.Addr{}, "",
				"annotation %s %s: %v", ipsName, textlimit.Quote(ipsValue), err)
		}
		req.IPs = ips
	}
	if f := strings.TrimSpace(svc.Spec.LoadBalancerIP); f != "" {
		ip, err := parseIP(f)
		if err != nil {
			return Request{}, warns, errorf(ReasonInvalidAnnotation, key, netip.Addr{}, "",
				"spec.loadBalancerIP %s: %v", textlimit.Quote(svc.Spec.LoadBalancerIP), err)
		}
		warns = append(warns, Warning{Reason: WarningDeprecatedField, Message: fmt.Sprintf(
			"spec.loadBalancerIP is deprecated, use annotation %s", AnnotationLoadBalancerIPs)})
		switch {
		case req.IPs == nil:
			req.IPs = []netip.Addr{ip}
		case !slices.Contains(req.IPs, ip):
			return Request{}, warns, errorf(ReasonInvalidAnnotation, key, ip, "",
				"spec.loadBalancerIP %s conflicts with annotation %s %s: remove the deprecated field",
				textlimit.Quote(svc.Spec.LoadBalancerIP), ipsName, textlimit.Quote(ipsValue))
		}
	}

	if name, v, ok := annotation(svc, AnnotationAddressPool, &warns); ok {
		v = strings.TrimSpace(v)
		if v != "" {
			if errs := validation.IsDNS1123Subdomain(v); len(errs) > 0 {
				return Request{}, warns, errorf(ReasonInvalidAnnotation, key, netip.Addr{}, "",
					"annotation %s %s: not a valid pool name: %s", name, textlimit.Quote(v), strings.Join(errs, "; "))
			}
			req.Pool = v
		}
	}
	if _, v, ok := annotation(svc, AnnotationAllowSharedIP, &warns); ok {
		req.SharingKey = v
	}

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

	norm, err := normalize(req)
	if err != nil {
		err.Key = key
		if ipsSet {
			err.Message = fmt.Sprintf("annotation %s %s: %s", ipsName, textlimit.Quote(ipsValue), err.Message)
		} else if svc.Spec.LoadBalancerIP != "" {
			err.Message = fmt.Sprintf("spec.loadBalancerIP %s: %s", textlimit.Quote(svc.Spec.LoadBalancerIP), err.Message)
		}
		return Request{}, warns, err
	}
	return norm, warns, nil
}

// annotation reads name (a metallb.io/ annotation) or its legacy form,
// recording a deprecation warning when the legacy form is present. It returns
// the name actually used so errors can quote it.
func annotation(svc *corev1.Service, name string, warns *[]Warning) (used, value string, ok bool) {
	legacy := legacyPrefix + strings.TrimPrefix(name, newPrefix)
	v, ok := svc.Annotations[name]
	lv, lok := svc.Annotations[legacy]
	if lok {
		msg := fmt.Sprintf("annotation %s is deprecated, use %s", legacy, name)
		if ok {
			msg += fmt.Sprintf(" (both are set; %s wins)", name)
		}
		*warns = append(*warns, Warning{Reason: WarningDeprecatedAnnotation, Message: msg})
	}
	if ok {
		return name, v, true
	}
	if lok {
		return legacy, lv, true
	}
	return name, "", false
}

func parseIP(s string) (netip.Addr, error) {
	ip, err := netip.ParseAddr(s)
	if err != nil {
		return netip.Addr{}, fmt.Errorf("%s is not an IP address", textlimit.Quote(s))
	}
	if ip.Zone() != "" {
		return netip.Addr{}, fmt.Errorf("%s: zoned addresses are not allowed", textlimit.Quote(s))
	}
	if ip.Is4In6() {
		return netip.Addr{}, fmt.Errorf("%s: IPv4-mapped IPv6 addresses are not allowed, write %s", textlimit.Quote(s), ip.Unmap())
	}
	return ip, nil
}

// parseIPList parses a comma-separated list: at most one address per family.
func parseIPList(v string) ([]netip.Addr, error) {
	var ips []netip.Addr
	for _, part := range strings.Split(v, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			return nil, fmt.Errorf("empty entry in list")
		}
		ip, err := parseIP(part)
		if err != nil {
			return nil, err
		}
		for _, prev := range ips {
			if prev == ip {
				return nil, fmt.Errorf("%s is listed twice", ip)
			}
			if prev.Is4() == ip.Is4() {
				return nil, fmt.Errorf("at most one address per family, got %s and %s", prev, ip)
			}
		}
		ips = append(ips, ip)
	}
	return ips, nil
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
	for _, ip := range req.IPs {
		if !ip.IsValid() || ip.Zone() != "" || ip.Is4In6() {
			return out, errorf(ReasonInvalidRequest, "", ip, "", "invalid requested address %q", ip)
		}
		for _, prev := range out.IPs {
			if prev.Is4() == ip.Is4() {
				return out, errorf(ReasonFamilyMismatch, "", ip, "",
					"at most one address per family, got %s and %s", prev, ip)
			}
		}
		out.IPs = append(out.IPs, ip)
	}
	if len(out.Families) == 0 {
		for _, ip := range out.IPs {
			out.Families = append(out.Families, familyOf(ip))
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
	if out.Policy == corev1.IPFamilyPolicyRequireDualStack && len(out.IPs) == 1 {
		return out, errorf(ReasonFamilyMismatch, "", out.IPs[0], "",
			"ipFamilyPolicy RequireDualStack needs one requested address per family, got only %s", out.IPs[0])
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
