/*
Copyright 2026 The ironlb Authors.

Licensed under the Apache License, Version 2.0 (the "License");
you may not use this file except in compliance with the License.
You may obtain a copy of the License at

    http://www.apache.org/licenses/LICENSE-2.0

Unless required by applicable law or agreed to in writing, software
distributed under the License is distributed on an "AS IS" BASIS,
WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
See the License for the specific language governing permissions and
limitations under the License.
*/

package v1beta1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// IPAddressPoolSpec defines the addresses a pool hands out and to which Services.
type IPAddressPoolSpec struct {
	// Addresses is the list of addresses the pool hands out. Each entry is either a
	// CIDR ("192.168.10.0/24", "fc00:f853:ccd:e799::/124"; use /32 or /128 for a
	// single address) or an inclusive range "start-end" ("192.168.9.1-192.168.9.5";
	// spaces around the dash are ignored, start must not be after end, both of one
	// family). IPv4 and IPv6 entries may be mixed in one pool, as dual-stack Services
	// need. Entries must not overlap each other, the addresses of any other pool or
	// the cluster's pod and Service networks, and must not include loopback,
	// link-local, multicast or unspecified addresses. The validating webhook checks
	// the syntax with the parser the daemons use (no CEL rule: it would run first and
	// hide the webhook's more precise message).
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=4096
	// +kubebuilder:validation:items:MinLength=1
	// +kubebuilder:validation:items:MaxLength=128
	// +required
	Addresses []string `json:"addresses"`

	// AutoAssign lets the controller pick addresses from this pool for any Service
	// that does not ask for a specific pool or address. When false, the pool is only
	// used by Services that name it (annotation metallb.io/address-pool) or request
	// one of its addresses (metallb.io/loadBalancerIPs or spec.loadBalancerIP).
	// +kubebuilder:default:=true
	// +optional
	AutoAssign *bool `json:"autoAssign,omitempty"`

	// AvoidBuggyIPs skips IPv4 addresses ending in .0 or .255, which some old or
	// broken clients and routers treat as network or broadcast addresses.
	// +kubebuilder:default:=false
	// +optional
	AvoidBuggyIPs bool `json:"avoidBuggyIPs,omitempty"`

	// ServiceAllocation restricts the pool to some namespaces or Services and ranks
	// it against other pools during automatic allocation. When unset, the pool
	// serves every Service at the lowest priority.
	// +optional
	ServiceAllocation *ServiceAllocation `json:"serviceAllocation,omitempty"`
}

// ServiceAllocation restricts which Services an IPAddressPool serves and how it
// ranks against other pools when a Service asks for no particular pool.
type ServiceAllocation struct {
	// Priority ranks this pool against other matching pools: a lower number is
	// preferred (1 is the highest priority); 0 or unset is the lowest priority.
	// Pools of equal priority are tried in a stable order (by name).
	// +optional
	Priority int `json:"priority,omitempty"`

	// Namespaces lists the namespaces whose Services may get addresses from this
	// pool automatically. Combined with namespaceSelectors (either matches).
	// +optional
	Namespaces []string `json:"namespaces,omitempty"`

	// NamespaceSelectors select, by label, the namespaces whose Services may get
	// addresses from this pool automatically. Selectors are ORed and are resolved to
	// namespace names whenever namespaces or pools change.
	// +optional
	NamespaceSelectors []metav1.LabelSelector `json:"namespaceSelectors,omitempty"`

	// ServiceSelectors select, by label, the Services that may get addresses from this
	// pool automatically. Selectors are ORed. When namespaces are also given, a
	// Service must match both.
	// +optional
	ServiceSelectors []metav1.LabelSelector `json:"serviceSelectors,omitempty"`
}

// IPAddressPoolStatus reports how many addresses of the pool are in use. The
// controller keeps it current.
type IPAddressPoolStatus struct {
	// AssignedIPv4 is the number of IPv4 addresses of the pool assigned to Services.
	AssignedIPv4 int64 `json:"assignedIPv4"`

	// AssignedIPv6 is the number of IPv6 addresses of the pool assigned to Services
	// (saturates at the largest int64).
	AssignedIPv6 int64 `json:"assignedIPv6"`

	// AvailableIPv4 is the number of IPv4 addresses of the pool still free.
	AvailableIPv4 int64 `json:"availableIPv4"`

	// AvailableIPv6 is the number of IPv6 addresses of the pool still free
	// (saturates at the largest int64, e.g. for a /64).
	AvailableIPv6 int64 `json:"availableIPv6"`

	// Conditions describe the pool's state, e.g. whether its configuration was
	// accepted and whether it is exhausted.
	// +listType=map
	// +listMapKey=type
	// +optional
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// IPAddressPool is a set of addresses that ironlb (like MetalLB) assigns to
// Services of type LoadBalancer. Create it in the namespace ironlb is installed in.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:storageversion
// +kubebuilder:printcolumn:name="Auto Assign",type=boolean,JSONPath=`.spec.autoAssign`
// +kubebuilder:printcolumn:name="Avoid Buggy IPs",type=boolean,JSONPath=`.spec.avoidBuggyIPs`
// +kubebuilder:printcolumn:name="Addresses",type=string,JSONPath=`.spec.addresses`
// +kubebuilder:printcolumn:name="Assigned IPv4",type=integer,JSONPath=`.status.assignedIPv4`,priority=1
// +kubebuilder:printcolumn:name="Available IPv4",type=integer,JSONPath=`.status.availableIPv4`,priority=1
// +kubebuilder:printcolumn:name="Assigned IPv6",type=integer,JSONPath=`.status.assignedIPv6`,priority=1
// +kubebuilder:printcolumn:name="Available IPv6",type=integer,JSONPath=`.status.availableIPv6`,priority=1
type IPAddressPool struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// Spec is the addresses of the pool and the Services it serves.
	// +required
	Spec IPAddressPoolSpec `json:"spec"`

	// Status is how many addresses are assigned and available, written by the
	// controller.
	// +optional
	Status IPAddressPoolStatus `json:"status,omitempty"`
}

// IPAddressPoolList is a list of IPAddressPool.
//
// +kubebuilder:object:root=true
type IPAddressPoolList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []IPAddressPool `json:"items"`
}
