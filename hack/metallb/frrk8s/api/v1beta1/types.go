package v1beta1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// +kubebuilder:object:root=true

// FRRConfiguration is the BGP configuration frr-k8s applies to the nodes its NodeSelector
// selects.
type FRRConfiguration struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec FRRConfigurationSpec `json:"spec,omitempty"`
}

// +kubebuilder:object:root=true

// FRRConfigurationList is a list of FRRConfiguration.
type FRRConfigurationList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []FRRConfiguration `json:"items"`
}

// FRRConfigurationSpec is the BGP configuration and the nodes it applies to.
type FRRConfigurationSpec struct {
	BGP          BGPConfig            `json:"bgp,omitempty"`
	NodeSelector metav1.LabelSelector `json:"nodeSelector,omitempty"`
}

// BGPConfig is the set of BGP routers and BFD profiles.
type BGPConfig struct {
	Routers     []Router     `json:"routers"`
	BFDProfiles []BFDProfile `json:"bfdProfiles,omitempty"`
}

// Router is one BGP router (an ASN in a VRF) with its neighbors and the prefixes it may
// advertise.
type Router struct {
	ASN       uint32     `json:"asn"`
	ID        string     `json:"id,omitempty"`
	VRF       string     `json:"vrf,omitempty"`
	Neighbors []Neighbor `json:"neighbors,omitempty"`
	Prefixes  []string   `json:"prefixes,omitempty"`
}

// DynamicASNMode is "internal" or "external": the peer's ASN is learned, not configured.
type DynamicASNMode string

// Neighbor is one BGP session of a Router.
type Neighbor struct {
	Address                string           `json:"address,omitempty"`
	Interface              string           `json:"interface,omitempty"`
	ASN                    uint32           `json:"asn,omitempty"`
	DynamicASN             DynamicASNMode   `json:"dynamicASN,omitempty"`
	Port                   *uint16          `json:"port,omitempty"`
	Password               string           `json:"password,omitempty"`
	PasswordSecret         SecretReference  `json:"passwordSecret,omitempty"`
	HoldTime               *metav1.Duration `json:"holdTime,omitempty"`
	KeepaliveTime          *metav1.Duration `json:"keepaliveTime,omitempty"`
	ConnectTime            *metav1.Duration `json:"connectTime,omitempty"`
	EBGPMultiHop           bool             `json:"ebgpMultiHop,omitempty"`
	BFDProfile             string           `json:"bfdProfile,omitempty"`
	EnableGracefulRestart  bool             `json:"enableGracefulRestart,omitempty"`
	ToAdvertise            Advertise        `json:"toAdvertise,omitempty"`
	DisableMP              bool             `json:"disableMP,omitempty"`
	DualStackAddressFamily bool             `json:"dualStackAddressFamily,omitempty"`
}

// Advertise is what a Neighbor is sent, and with which attributes.
type Advertise struct {
	Allowed                   AllowedOutPrefixes      `json:"allowed,omitempty"`
	PrefixesWithLocalPref     []LocalPrefPrefixes     `json:"withLocalPref,omitempty"`
	PrefixesWithCommunity     []CommunityPrefixes     `json:"withCommunity,omitempty"`
	PrefixesWithAsPathPrepend []AsPathPrependPrefixes `json:"withAsPathPrepend,omitempty"`
}

// AllowedOutPrefixes are the prefixes advertised to a Neighbor.
type AllowedOutPrefixes struct {
	Prefixes []string `json:"prefixes,omitempty"`
}

// LocalPrefPrefixes are prefixes advertised with a LOCAL_PREF.
type LocalPrefPrefixes struct {
	Prefixes  []string `json:"prefixes,omitempty"`
	LocalPref uint32   `json:"localPref,omitempty"`
}

// CommunityPrefixes are prefixes advertised with a community.
type CommunityPrefixes struct {
	Prefixes  []string `json:"prefixes,omitempty"`
	Community string   `json:"community,omitempty"`
}

// AsPathPrependPrefixes are prefixes advertised with the local ASN prepended to the path.
type AsPathPrependPrefixes struct {
	Prefixes      []string `json:"prefixes,omitempty"`
	AsPathPrepend uint8    `json:"asPathPrepend,omitempty"`
}

// SecretReference names the Secret holding a Neighbor's password.
type SecretReference struct {
	Name      string `json:"name,omitempty"`
	Namespace string `json:"namespace,omitempty"`
}

// BFDProfile is a named set of BFD timers a Neighbor refers to.
type BFDProfile struct {
	Name             string  `json:"name"`
	ReceiveInterval  *uint32 `json:"receiveInterval,omitempty"`
	TransmitInterval *uint32 `json:"transmitInterval,omitempty"`
	DetectMultiplier *uint32 `json:"detectMultiplier,omitempty"`
	EchoInterval     *uint32 `json:"echoInterval,omitempty"`
	EchoMode         *bool   `json:"echoMode,omitempty"`
	PassiveMode      *bool   `json:"passiveMode,omitempty"`
	MinimumTTL       *uint32 `json:"minimumTtl,omitempty"`
}
