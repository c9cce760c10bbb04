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

// Package v1beta1 holds ironlb's API: the MetalLB-compatible custom resources
// IPAddressPool, L2Advertisement and ServiceL2Status in group metallb.io, version
// v1beta1. Field names and JSON shapes match MetalLB's so existing manifests apply
// unchanged. The package depends on apimachinery only, so any client can import it.
//
// +kubebuilder:object:generate=true
// +groupName=metallb.io
package v1beta1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

var (
	// GroupVersion is the group and version of every type in this package.
	GroupVersion = schema.GroupVersion{Group: "metallb.io", Version: "v1beta1"}

	// SchemeGroupVersion is GroupVersion under the name client-go code expects.
	SchemeGroupVersion = GroupVersion

	// SchemeBuilder registers this package's types in a runtime.Scheme.
	SchemeBuilder = runtime.NewSchemeBuilder(addKnownTypes)

	// AddToScheme adds this package's types to a scheme.
	AddToScheme = SchemeBuilder.AddToScheme
)

// Resource returns the GroupResource of a resource in this group, e.g. "ipaddresspools".
func Resource(resource string) schema.GroupResource {
	return GroupVersion.WithResource(resource).GroupResource()
}

func addKnownTypes(s *runtime.Scheme) error {
	s.AddKnownTypes(GroupVersion,
		&IPAddressPool{}, &IPAddressPoolList{},
		&L2Advertisement{}, &L2AdvertisementList{},
		&ServiceL2Status{}, &ServiceL2StatusList{},
		&ConfigurationState{}, &ConfigurationStateList{},
	)
	metav1.AddToGroupVersion(s, GroupVersion)
	return nil
}
