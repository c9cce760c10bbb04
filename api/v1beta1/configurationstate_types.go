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

// ConfigurationResult says whether a component could load the configuration.
// +kubebuilder:validation:Enum=Valid;Invalid;Unknown
type ConfigurationResult string

const (
	// ConfigurationResultValid: every condition of the object is True.
	ConfigurationResultValid ConfigurationResult = "Valid"
	// ConfigurationResultInvalid: at least one condition is False; errorSummary
	// says why.
	ConfigurationResultInvalid ConfigurationResult = "Invalid"
	// ConfigurationResultUnknown: the component has reported nothing yet.
	ConfigurationResultUnknown ConfigurationResult = "Unknown"
)

// Labels a ConfigurationState carries, so `kubectl get configurationstates -l`
// can select one component kind or one node.
const (
	// LabelComponentType is "controller" or "speaker".
	LabelComponentType = "metallb.io/component-type"
	// LabelNodeName is the node of a speaker's ConfigurationState.
	LabelNodeName = "metallb.io/node-name"
)

// ConfigurationStateStatus is what one component reports about the
// configuration (IPAddressPools, L2Advertisements) it loaded.
type ConfigurationStateStatus struct {
	// Result sums up the conditions: Valid when all are True, Invalid when
	// one is False, Unknown before the component reported.
	// +optional
	Result ConfigurationResult `json:"result,omitempty"`

	// ErrorSummary holds the messages of the False conditions, one per line;
	// empty when Result is Valid.
	// +optional
	ErrorSummary string `json:"errorSummary,omitempty"`

	// Conditions are written by the component's reconcilers, one type each:
	// poolReconcilerValid (controller) and configReconcilerValid (speaker).
	// True with reason Reconciled when the configuration loaded; False with
	// reason ConfigurationError and the parser's message when it was refused
	// (the component then keeps using the last valid configuration).
	// +optional
	// +patchMergeKey=type
	// +patchStrategy=merge
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty" patchStrategy:"merge" patchMergeKey:"type"`
}

// ConfigurationState reports whether a component (the controller, or the
// speaker of one node) could load the configuration applied to the cluster:
// errors the webhook did not catch (it was off, or two objects were applied
// concurrently) show here instead of only in the logs. The object named
// "controller" is written by the controller's leader, "speaker-<node>" by
// each node's speaker. It has no spec.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:storageversion
// +kubebuilder:resource:scope=Namespaced
// +kubebuilder:printcolumn:name="Result",type=string,JSONPath=`.status.result`
// +kubebuilder:printcolumn:name="ErrorSummary",type=string,JSONPath=`.status.errorSummary`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type ConfigurationState struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// Status is written by the component the object is named after.
	// +optional
	Status ConfigurationStateStatus `json:"status,omitempty"`
}

// ConfigurationStateList is a list of ConfigurationState.
//
// +kubebuilder:object:root=true
type ConfigurationStateList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []ConfigurationState `json:"items"`
}
