// Package service answers the questions about a Service that more than one
// component asks: is it ours (type and loadBalancerClass), which ingress IPs
// does its status show, which addresses and pool does it request, and which
// sharing key does it carry. The controller, the speaker, the election and
// `ironlb cleanup` all read a Service through it, so they can never disagree
// on what a Service says.
//
// The annotations are MetalLB's: the metallb.io/ form, and the legacy
// metallb.universe.tf/ form, which is still read; the metallb.io/ form wins
// when both are set, even when it is empty.
package service

import (
	"fmt"
	"net/netip"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/ironlb/ironlb/internal/textlimit"
)

// Service annotations, MetalLB-compatible.
const (
	AnnotationLoadBalancerIPs = "metallb.io/loadBalancerIPs"
	AnnotationAddressPool     = "metallb.io/address-pool"
	AnnotationAllowSharedIP   = "metallb.io/allow-shared-ip"
	// AnnotationIPAllocatedFromPool is written by the controller on every
	// Service it gave an IP, naming the pool the IP came from.
	AnnotationIPAllocatedFromPool = "metallb.io/ip-allocated-from-pool"

	// Prefix is the annotations' prefix; LegacyPrefix the legacy one.
	Prefix       = "metallb.io/"
	LegacyPrefix = "metallb.universe.tf/"
)

// AnnotationAddressCount asks for this many addresses per family (ironlb's
// own; MetalLB has no equivalent): the speakers announce each from a
// different node, so one Service's traffic spreads over several nodes.
const AnnotationAddressCount = "ironlb.io/address-count"

// MaxAddressCount bounds AnnotationAddressCount: a spread wider than a rack
// is better served by several Services.
const MaxAddressCount = 16

// FieldLoadBalancerIP is the deprecated Service field naming one requested address.
const FieldLoadBalancerIP = "spec.loadBalancerIP"

// Key is the Service's namespace/name, as logs, events and the allocator name it.
func Key(svc *corev1.Service) string { return svc.Namespace + "/" + svc.Name }

// TCPPort is the Service's first TCP port, where a client's connection to
// its load-balancer IP can be tried (0 when it has none: UDP or SCTP only).
func TCPPort(svc *corev1.Service) uint16 {
	for _, p := range svc.Spec.Ports {
		if (p.Protocol == corev1.ProtocolTCP || p.Protocol == "") && p.Port > 0 && p.Port < 1<<16 {
			return uint16(p.Port)
		}
	}
	return 0
}

// ClassMatches applies MetalLB's loadBalancerClass filter: with class ""
// only Services without spec.loadBalancerClass match (a class set to ""
// is a class, not its absence), otherwise only Services of exactly that
// class.
func ClassMatches(svc *corev1.Service, class string) bool {
	if class == "" {
		return svc.Spec.LoadBalancerClass == nil
	}
	return svc.Spec.LoadBalancerClass != nil && *svc.Spec.LoadBalancerClass == class
}

// Handles reports whether svc is a LoadBalancer Service of class (see
// ClassMatches): the Services an ironlb of that class allocates and announces.
func Handles(svc *corev1.Service, class string) bool {
	return svc.Spec.Type == corev1.ServiceTypeLoadBalancer && ClassMatches(svc, class)
}

// Annotation is one metallb.io/ annotation read together with its legacy form.
type Annotation struct {
	// Name is the annotation actually read (the legacy name when only it is
	// set), so messages quote what the user wrote.
	Name  string
	Value string
	// Set: either form is present (Value may still be empty).
	Set bool
	// Legacy: the legacy form is present, read or not.
	Legacy bool
	// Both: both forms are present; the metallb.io/ one was read.
	Both bool
}

// Get reads the annotation name (a metallb.io/ name) or its legacy form.
func Get(svc *corev1.Service, name string) Annotation {
	legacy := LegacyName(name)
	v, ok := svc.Annotations[name]
	lv, lok := svc.Annotations[legacy]
	switch {
	case ok:
		return Annotation{Name: name, Value: v, Set: true, Legacy: lok, Both: lok}
	case lok:
		return Annotation{Name: legacy, Value: lv, Set: true, Legacy: true}
	}
	return Annotation{Name: name}
}

// LegacyName is the metallb.universe.tf/ form of a metallb.io/ annotation.
func LegacyName(name string) string { return LegacyPrefix + strings.TrimPrefix(name, Prefix) }

// Deprecation is the message telling the user a legacy annotation is in
// use, "" when it is not.
func (a Annotation) Deprecation() string {
	if !a.Legacy {
		return ""
	}
	name := a.Name
	if !a.Both {
		name = Prefix + strings.TrimPrefix(a.Name, LegacyPrefix)
	}
	msg := fmt.Sprintf("annotation %s is deprecated, use %s", LegacyName(name), name)
	if a.Both {
		msg += fmt.Sprintf(" (both are set; %s wins)", name)
	}
	return msg
}

// SharingKey is the Service's allow-shared-ip key, "" when it does not
// share its IP. The value is used as written (MetalLB compares it verbatim).
func SharingKey(svc *corev1.Service) string {
	return Get(svc, AnnotationAllowSharedIP).Value
}

// Error is a Service field or annotation that cannot be read. Message names
// the field and quotes its value; Error adds the Service.
type Error struct {
	Service string     // namespace/name
	Field   string     // e.g. "annotation metallb.io/loadBalancerIPs", "spec.loadBalancerIP"
	Value   string     // the value as written
	IP      netip.Addr // the offending address, when one parsed
	Message string
}

func (e *Error) Error() string { return "service " + e.Service + ": " + e.Message }

func fieldError(svc *corev1.Service, field, value string, ip netip.Addr, format string, args ...any) *Error {
	return &Error{Service: Key(svc), Field: field, Value: value, IP: ip, Message: fmt.Sprintf(format, args...)}
}

// IngressIPs returns the IPs of the Service's status.loadBalancer.ingress in
// status order. Entries are trimmed of spaces; empty ones (a hostname-only
// ingress) are skipped; IPv4-mapped IPv6 addresses are unmapped; duplicates
// are dropped. An entry that is not an IP address, or carries a zone, is an
// *Error naming the Service, the entry and its value; the IPs of the other
// entries are still returned, so a caller that must not give them to another
// Service (the controller) can hold them, while one that acts on them (the
// speaker) refuses the Service.
func IngressIPs(svc *corev1.Service) ([]netip.Addr, error) {
	var ips []netip.Addr
	var first error
	for i, ing := range svc.Status.LoadBalancer.Ingress {
		s := strings.TrimSpace(ing.IP)
		if s == "" {
			continue
		}
		ip, err := netip.ParseAddr(s)
		problem := ""
		switch {
		case err != nil:
			problem = "not an IP address"
		case ip.Zone() != "":
			problem = "zoned addresses are not allowed"
		}
		if problem != "" {
			if first == nil {
				field := fmt.Sprintf("status.loadBalancer.ingress[%d].ip", i)
				first = fieldError(svc, field, ing.IP, netip.Addr{}, "%s %s: %s", field, textlimit.Quote(ing.IP), problem)
			}
			continue
		}
		ip = ip.Unmap()
		if !containsAddr(ips, ip) {
			ips = append(ips, ip)
		}
	}
	return ips, first
}

func containsAddr(ips []netip.Addr, ip netip.Addr) bool {
	for _, x := range ips {
		if x == ip {
			return true
		}
	}
	return false
}

// Requested is what a Service asks for by address.
type Requested struct {
	// IPs are the requested addresses in the order written, as many per
	// family as Count; nil when none is requested.
	IPs []netip.Addr
	// Count is the number of addresses per family (AnnotationAddressCount,
	// else the number of requested addresses of a family; 1 by default).
	Count int
	// Annotation is the loadBalancerIPs annotation as read.
	Annotation Annotation
	// Field: the deprecated spec.loadBalancerIP is set (and parsed).
	Field bool
}

// RequestedIPs reads the addresses the Service asks for: the
// metallb.io/loadBalancerIPs annotation (or its legacy form), a
// comma-separated list, the deprecated spec.loadBalancerIP, which must then
// be one of them, and how many per family (AnnotationAddressCount). MetalLB
// allows one address per family; several of one family is ironlb's
// extension, and needs as many of the other family in the list, if any, and
// AnnotationAddressCount, if set, to agree. A value that does not parse or
// does not agree is an *Error naming the annotation or field and quoting the
// value. Requested is filled as far as parsing got, so a caller can report
// the legacy annotation or field even with an error.
func RequestedIPs(svc *corev1.Service) (Requested, error) {
	ann := Get(svc, AnnotationLoadBalancerIPs)
	r := Requested{Annotation: ann, Count: 1}
	listed := 0 // addresses per family in the annotation
	if ann.Set && strings.TrimSpace(ann.Value) != "" {
		ips, per, err := parseIPList(ann.Value)
		if err != nil {
			field := "annotation " + ann.Name
			return r, fieldError(svc, field, ann.Value, netip.Addr{}, "%s %s: %v", field, textlimit.Quote(ann.Value), err)
		}
		r.IPs, listed, r.Count = ips, per, per
	}
	if v, ok := svc.Annotations[AnnotationAddressCount]; ok {
		n, err := ParseAddressCount(v)
		field := "annotation " + AnnotationAddressCount
		if err != nil {
			return r, fieldError(svc, field, v, netip.Addr{}, "%s %s: %v", field, textlimit.Quote(v), err)
		}
		if listed > 0 && n != listed {
			return r, fieldError(svc, field, v, netip.Addr{}, "%s %s: annotation %s %s lists %d addresses per family",
				field, textlimit.Quote(v), ann.Name, textlimit.Quote(ann.Value), listed)
		}
		r.Count = n
	}
	if f := strings.TrimSpace(svc.Spec.LoadBalancerIP); f != "" {
		ip, err := ParseIP(f)
		if err != nil {
			return r, fieldError(svc, FieldLoadBalancerIP, svc.Spec.LoadBalancerIP, netip.Addr{}, "%s %s: %v",
				FieldLoadBalancerIP, textlimit.Quote(svc.Spec.LoadBalancerIP), err)
		}
		r.Field = true
		switch {
		case r.IPs == nil && r.Count > 1:
			return r, fieldError(svc, FieldLoadBalancerIP, svc.Spec.LoadBalancerIP, ip,
				"%s %s names one address, annotation %s asks for %d per family: list them in annotation %s",
				FieldLoadBalancerIP, textlimit.Quote(svc.Spec.LoadBalancerIP), AnnotationAddressCount, r.Count, AnnotationLoadBalancerIPs)
		case r.IPs == nil:
			r.IPs = []netip.Addr{ip}
		case !containsAddr(r.IPs, ip):
			return r, fieldError(svc, FieldLoadBalancerIP, svc.Spec.LoadBalancerIP, ip,
				"%s %s conflicts with annotation %s %s: remove the deprecated field",
				FieldLoadBalancerIP, textlimit.Quote(svc.Spec.LoadBalancerIP), ann.Name, textlimit.Quote(ann.Value))
		}
	}
	return r, nil
}

// ParseAddressCount parses AnnotationAddressCount: an integer from 1 to
// MaxAddressCount.
func ParseAddressCount(v string) (int, error) {
	n, err := strconv.Atoi(strings.TrimSpace(v))
	if err != nil || n < 1 || n > MaxAddressCount {
		return 0, fmt.Errorf("want a number of addresses per family from 1 to %d", MaxAddressCount)
	}
	return n, nil
}

// RequestedPool reads the address-pool annotation (or its legacy form):
// the pool name, trimmed, "" when none is requested. A name that is not a
// DNS-1123 subdomain is an *Error naming the annotation and the value.
func RequestedPool(svc *corev1.Service) (string, Annotation, error) {
	ann := Get(svc, AnnotationAddressPool)
	v := strings.TrimSpace(ann.Value)
	if v == "" {
		return "", ann, nil
	}
	if errs := validation.IsDNS1123Subdomain(v); len(errs) > 0 {
		field := "annotation " + ann.Name
		return "", ann, fieldError(svc, field, v, netip.Addr{}, "%s %s: not a valid pool name: %s",
			field, textlimit.Quote(v), strings.Join(errs, "; "))
	}
	return v, ann, nil
}

// ParseIP parses one requested address: no zone, no IPv4-mapped IPv6
// address (the caller has trimmed it).
func ParseIP(s string) (netip.Addr, error) {
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

// JoinIPs writes ips in order, separated by sep: "172.18.255.200, fd00::1"
// in messages, "172.18.255.200,fd00::1" in annotations.
func JoinIPs(ips []netip.Addr, sep string) string {
	s := make([]string, len(ips))
	for i, ip := range ips {
		s[i] = ip.String()
	}
	return strings.Join(s, sep)
}

// parseIPList parses a comma-separated list of requested addresses, spaces
// around entries allowed: no empty entry, no address twice, at most
// MaxAddressCount per family, and as many of each family listed. It returns
// the addresses in the order written and how many there are per family.
func parseIPList(v string) ([]netip.Addr, int, error) {
	var ips []netip.Addr
	var v4, v6 int
	for _, part := range strings.Split(v, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			return nil, 0, fmt.Errorf("empty entry in list")
		}
		ip, err := ParseIP(part)
		if err != nil {
			return nil, 0, err
		}
		for _, prev := range ips {
			if prev == ip {
				return nil, 0, fmt.Errorf("%s is listed twice", ip)
			}
		}
		if ip.Is4() {
			v4++
		} else {
			v6++
		}
		if v4 > MaxAddressCount || v6 > MaxAddressCount {
			return nil, 0, fmt.Errorf("at most %d addresses per family (annotation %s)", MaxAddressCount, AnnotationAddressCount)
		}
		ips = append(ips, ip)
	}
	if v4 > 0 && v6 > 0 && v4 != v6 {
		return nil, 0, fmt.Errorf("%d IPv4 and %d IPv6 addresses: list as many of each family", v4, v6)
	}
	return ips, max(v4, v6, 1), nil
}
