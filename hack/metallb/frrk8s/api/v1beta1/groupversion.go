package v1beta1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// GroupVersion is the group and version of the FRRConfiguration API.
var GroupVersion = schema.GroupVersion{Group: "frrk8s.metallb.io", Version: "v1beta1"}

var (
	schemeBuilder = runtime.NewSchemeBuilder(addKnownTypes)
	// AddToScheme registers FRRConfiguration and FRRConfigurationList with a scheme.
	AddToScheme = schemeBuilder.AddToScheme
)

func addKnownTypes(scheme *runtime.Scheme) error {
	scheme.AddKnownTypes(GroupVersion, &FRRConfiguration{}, &FRRConfigurationList{})
	metav1.AddToGroupVersion(scheme, GroupVersion)
	return nil
}
