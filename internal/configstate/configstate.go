// Package configstate keeps a component's ConfigurationState object (MetalLB's
// status-only kind, group metallb.io) in step with whether the configuration
// the component loaded is valid.
//
// MetalLB's layout is kept so its tooling and documentation apply: the
// controller writes the object "controller" with condition poolReconcilerValid,
// each node's speaker "speaker-<node>" with configReconcilerValid; labels
// metallb.io/component-type and metallb.io/node-name; status.result and
// status.errorSummary sum the conditions up. Unlike MetalLB, an outcome that did
// not change writes nothing: lastTransitionTime moves only when a condition's
// status does.
package configstate

import (
	"errors"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ironlb/ironlb/api/v1beta1"
	"github.com/ironlb/ironlb/internal/config"
	"github.com/ironlb/ironlb/internal/textlimit"
)

// Condition types, one per writer, as MetalLB names them.
const (
	// ConditionPoolReconcilerValid is the controller's.
	ConditionPoolReconcilerValid = "poolReconcilerValid"
	// ConditionConfigReconcilerValid is a speaker's.
	ConditionConfigReconcilerValid = "configReconcilerValid"
)

// Condition reasons.
const (
	// ReasonReconciled: the configuration loaded (status True).
	ReasonReconciled = "Reconciled"
	// ReasonConfigurationError: the configuration was refused (status False);
	// the message is the parser's, naming object, field and value.
	ReasonConfigurationError = "ConfigurationError"
)

// Component types (label metallb.io/component-type) and the controller's
// object name.
const (
	ComponentController = "controller"
	ComponentSpeaker    = "speaker"
	ControllerName      = "controller"
)

// maxMessage is the API server's limit on a condition message; errorSummary
// is bounded the same way so a pool with thousands of bad entries cannot make
// the object too large to write.
const maxMessage = 32768

// SpeakerName is the name of node's speaker's object.
func SpeakerName(node string) string { return "speaker-" + node }

// ControllerLabels and SpeakerLabels are the labels of the objects.
func ControllerLabels() map[string]string {
	return map[string]string{v1beta1.LabelComponentType: ComponentController}
}

// SpeakerLabels are the labels of node's speaker's object.
func SpeakerLabels(node string) map[string]string {
	return map[string]string{v1beta1.LabelComponentType: ComponentSpeaker, v1beta1.LabelNodeName: node}
}

// IsConfigError reports whether err says the configuration is invalid (the
// parser refused it), as opposed to a failure to read it, which says nothing
// about the configuration and is retried instead of reported.
func IsConfigError(err error) bool {
	var fe *config.FieldError
	return errors.As(err, &fe)
}

// Status returns cur with condType set from configErr (nil: the configuration
// loaded) and result and errorSummary recomputed from every condition. cur is
// not modified. A condition whose status is unchanged keeps its
// lastTransitionTime, so reporting the same outcome twice returns a status
// equal to cur.
func Status(cur v1beta1.ConfigurationStateStatus, condType string, configErr error, now metav1.Time) v1beta1.ConfigurationStateStatus {
	out := *cur.DeepCopy()
	c := metav1.Condition{Type: condType, Status: metav1.ConditionTrue, Reason: ReasonReconciled, LastTransitionTime: now}
	if configErr != nil {
		c.Status, c.Reason, c.Message = metav1.ConditionFalse, ReasonConfigurationError, textlimit.Note(configErr.Error(), maxMessage)
	}
	meta.SetStatusCondition(&out.Conditions, c)
	// A stable order, so the written object does not depend on who wrote first.
	slices.SortFunc(out.Conditions, func(a, b metav1.Condition) int { return strings.Compare(a.Type, b.Type) })

	out.Result, out.ErrorSummary = v1beta1.ConfigurationResultValid, ""
	var msgs []string
	for _, cond := range out.Conditions {
		if cond.Status != metav1.ConditionTrue {
			out.Result = v1beta1.ConfigurationResultInvalid
			msgs = append(msgs, cond.Message)
		}
	}
	if len(msgs) > 0 {
		out.ErrorSummary = textlimit.Note(strings.Join(msgs, "\n"), maxMessage)
	}
	return out
}
