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

// L2AdvertisementSpec says which pools are announced with layer 2 (ARP for IPv4,
// NDP for IPv6), from which nodes and from which interfaces.
type L2AdvertisementSpec struct {
	// IPAddressPools names the pools whose addresses this advertisement announces.
	// Names of pools that do not exist are ignored. When neither ipAddressPools nor
	// ipAddressPoolSelectors is set, the advertisement applies to every pool.
	// +kubebuilder:validation:items:MinLength=1
	// +optional
	IPAddressPools []string `json:"ipAddressPools,omitempty"`

	// IPAddressPoolSelectors select, by label, the pools whose addresses this
	// advertisement announces, in addition to ipAddressPools. Selectors are ORed.
	// +optional
	IPAddressPoolSelectors []metav1.LabelSelector `json:"ipAddressPoolSelectors,omitempty"`

	// NodeSelectors limit the nodes that may announce the addresses: only nodes
	// matching one of the selectors take part in the election. Empty means every node.
	// +optional
	NodeSelectors []metav1.LabelSelector `json:"nodeSelectors,omitempty"`

	// Interfaces limits the network interfaces the addresses are announced from on
	// the elected node, e.g. ["eth0"]. Empty means every eligible interface. When
	// several advertisements apply to one node, their interfaces are combined. This
	// does not affect which node is elected.
	// +kubebuilder:validation:items:MinLength=1
	// +optional
	Interfaces []string `json:"interfaces,omitempty"`

	// ServiceSelectors limit the advertisement to the Services, among those with an
	// address from the selected pools, that match one of the selectors (ORed).
	// Empty means every Service of the pools.
	// +optional
	ServiceSelectors []metav1.LabelSelector `json:"serviceSelectors,omitempty"`

	// PreferredNodeSelectors are soft preferences among the nodes that may
	// announce (those nodeSelectors allow): a node's score is the sum of the
	// weights of the preferences it matches, over every advertisement that
	// applies to the Service and selects the node. A new address goes to a
	// node of the highest score that can take it, falling back to lower
	// scores when none can. ironlb keeps an address on its current node
	// while that node can carry the traffic, even when a node with a higher
	// score returns, unless the speakers run with --failback=immediate.
	// +optional
	PreferredNodeSelectors []PreferredNodeSelector `json:"preferredNodeSelectors,omitempty"`
}

// PreferredNodeSelector is one weighted preference, shaped like a Pod's
// preferredDuringSchedulingIgnoredDuringExecution term.
type PreferredNodeSelector struct {
	// Weight added to the score of the nodes the preference matches, 1-100.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=100
	// +required
	Weight int32 `json:"weight"`

	// Preference selects the nodes, by label, that receive the weight. An
	// empty selector matches every node the advertisement selects.
	// +required
	Preference metav1.LabelSelector `json:"preference"`
}

// L2AdvertisementStatus is empty; it exists for compatibility with MetalLB.
type L2AdvertisementStatus struct{}

// L2Advertisement makes the addresses of some IPAddressPools reachable with layer 2:
// one elected node answers ARP (IPv4) and NDP (IPv6) requests for each Service
// address. Create it in the namespace ironlb is installed in.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:storageversion
// +kubebuilder:printcolumn:name="IPAddressPools",type=string,JSONPath=`.spec.ipAddressPools`
// +kubebuilder:printcolumn:name="IPAddressPool Selectors",type=string,JSONPath=`.spec.ipAddressPoolSelectors`
// +kubebuilder:printcolumn:name="Interfaces",type=string,JSONPath=`.spec.interfaces`
// +kubebuilder:printcolumn:name="Node Selectors",type=string,JSONPath=`.spec.nodeSelectors`,priority=10
type L2Advertisement struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// Spec selects the pools, nodes, interfaces and Services of the advertisement.
	// +optional
	Spec L2AdvertisementSpec `json:"spec,omitempty"`

	// Status is empty.
	// +optional
	Status L2AdvertisementStatus `json:"status,omitempty"`
}

// L2AdvertisementList is a list of L2Advertisement.
//
// +kubebuilder:object:root=true
type L2AdvertisementList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []L2Advertisement `json:"items"`
}
