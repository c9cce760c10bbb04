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

// Labels the speaker sets on every ServiceL2Status, as MetalLB does, so users and
// tools can find the status of one Service or one node.
const (
	// ServiceL2StatusNodeLabel holds the name of the announcing node.
	ServiceL2StatusNodeLabel = "metallb.io/node"
	// ServiceL2StatusServiceNameLabel holds the name of the Service.
	ServiceL2StatusServiceNameLabel = "metallb.io/service-name"
	// ServiceL2StatusServiceNamespaceLabel holds the namespace of the Service.
	ServiceL2StatusServiceNamespaceLabel = "metallb.io/service-namespace"
	// ServiceL2StatusIPsAnnotation (ironlb's own) lists the IPs of the
	// Service the node announces, comma-separated: a Service with several
	// addresses per family (ironlb.io/address-count) has one announcer,
	// and one object, per address slot. Restarted speakers resume each
	// slot's owner from it.
	ServiceL2StatusIPsAnnotation = "ironlb.io/ips"
)

// ServiceL2StatusSpec is empty: everything is in the status.
type ServiceL2StatusSpec struct{}

// MetalLBServiceL2Status tells which node announces a Service's addresses and from
// which interfaces. The node and the Service never change for one object: when the
// announcer moves, the object is replaced.
type MetalLBServiceL2Status struct {
	// Node is the name of the node that announces the Service's addresses.
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="Value is immutable"
	// +optional
	Node string `json:"node,omitempty"`

	// ServiceName is the name of the announced Service.
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="Value is immutable"
	// +optional
	ServiceName string `json:"serviceName,omitempty"`

	// ServiceNamespace is the namespace of the announced Service.
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="Value is immutable"
	// +optional
	ServiceNamespace string `json:"serviceNamespace,omitempty"`

	// Interfaces lists the interfaces the addresses are announced from. Empty means
	// every eligible interface of the node.
	// +optional
	Interfaces []InterfaceInfo `json:"interfaces,omitempty"`

	// Conditions report problems seen by the announcing node, e.g. another host
	// answering ARP or NDP for the same address (an address conflict).
	// This field is an ironlb extension; MetalLB does not set it.
	// +listType=map
	// +listMapKey=type
	// +optional
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// InterfaceInfo names one network interface of the announcing node.
type InterfaceInfo struct {
	// Name is the interface name, e.g. "eth0".
	// +optional
	Name string `json:"name,omitempty"`
}

// ServiceL2Status shows which node announces a LoadBalancer Service's addresses with
// layer 2 (ARP/NDP). The elected node's speaker creates and deletes it.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:storageversion
// +kubebuilder:printcolumn:name="Allocated Node",type=string,JSONPath=`.status.node`
// +kubebuilder:printcolumn:name="Service Name",type=string,JSONPath=`.status.serviceName`
// +kubebuilder:printcolumn:name="Service Namespace",type=string,JSONPath=`.status.serviceNamespace`
type ServiceL2Status struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// Spec is empty.
	// +optional
	Spec ServiceL2StatusSpec `json:"spec,omitempty"`

	// Status names the announcing node, the Service and the interfaces.
	// +optional
	Status MetalLBServiceL2Status `json:"status,omitempty"`
}

// ServiceL2StatusList is a list of ServiceL2Status.
//
// +kubebuilder:object:root=true
type ServiceL2StatusList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []ServiceL2Status `json:"items"`
}
