package controllers_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/ironlb/ironlb/api/v1beta1"
	"github.com/ironlb/ironlb/internal/configstate"
)

// describeState is a ConfigurationState in one line, for failure messages.
func describeState(cs *v1beta1.ConfigurationState) string {
	return fmt.Sprintf("result=%q summary=%q conditions=%+v labels=%v owners=%v", cs.Status.Result, cs.Status.ErrorSummary, cs.Status.Conditions, cs.Labels, cs.OwnerReferences)
}

// The controller's ConfigurationState appears Valid, turns Invalid naming the
// refused pool when a pool overlaps another (webhook off), returns to Valid
// when it is removed, and is re-created when deleted.
func TestControllerConfigurationState(t *testing.T) {
	h := newHarness(t)
	h.opts.DeploymentName = "ironlb-controller"
	dep := controllerDeployment(h.installNS, h.opts.DeploymentName)
	h.create(dep)
	h.pool("first-pool", "172.18.255.200-172.18.255.250")
	h.start()
	key := client.ObjectKey{Namespace: h.installNS, Name: configstate.ControllerName}
	wait := func(what string, ok func(cs *v1beta1.ConfigurationState, c *metav1.Condition) bool) *v1beta1.ConfigurationState {
		t.Helper()
		var cs v1beta1.ConfigurationState
		h.eventually(what, func() (bool, string) {
			h.running()
			if err := k8s.Get(h.ctx, key, &cs); err != nil {
				return false, err.Error()
			}
			c := meta.FindStatusCondition(cs.Status.Conditions, configstate.ConditionPoolReconcilerValid)
			return c != nil && ok(&cs, c), describeState(&cs)
		})
		return &cs
	}

	valid := wait("controller ConfigurationState Valid", func(cs *v1beta1.ConfigurationState, c *metav1.Condition) bool {
		return cs.Status.Result == v1beta1.ConfigurationResultValid && cs.Status.ErrorSummary == "" &&
			c.Status == metav1.ConditionTrue && c.Reason == configstate.ReasonReconciled
	})
	if got := valid.Labels[v1beta1.LabelComponentType]; got != configstate.ComponentController {
		t.Errorf("label %s = %q", v1beta1.LabelComponentType, got)
	}
	if len(valid.OwnerReferences) != 1 || valid.OwnerReferences[0].Kind != "Deployment" || valid.OwnerReferences[0].Name != dep.Name {
		t.Errorf("owners %v, want the controller Deployment", valid.OwnerReferences)
	}

	h.pool("overlap", "172.18.255.240/28")
	invalid := wait("Invalid naming the overlapping pool", func(cs *v1beta1.ConfigurationState, c *metav1.Condition) bool {
		return cs.Status.Result == v1beta1.ConfigurationResultInvalid &&
			c.Status == metav1.ConditionFalse && c.Reason == configstate.ReasonConfigurationError &&
			strings.Contains(c.Message, `IPAddressPool "overlap": spec.addresses[0]: CIDR "172.18.255.240/28"`) &&
			cs.Status.ErrorSummary == c.Message
	})
	if invalid.Status.Conditions[0].LastTransitionTime.Before(&valid.Status.Conditions[0].LastTransitionTime) {
		t.Errorf("lastTransitionTime went back: %v then %v", valid.Status.Conditions[0].LastTransitionTime, invalid.Status.Conditions[0].LastTransitionTime)
	}

	if err := k8s.Delete(h.ctx, &v1beta1.IPAddressPool{ObjectMeta: metav1.ObjectMeta{Namespace: h.installNS, Name: "overlap"}}); err != nil {
		t.Fatal(err)
	}
	back := wait("Valid again", func(cs *v1beta1.ConfigurationState, c *metav1.Condition) bool {
		return cs.Status.Result == v1beta1.ConfigurationResultValid && c.Status == metav1.ConditionTrue && cs.Status.ErrorSummary == ""
	})

	if err := k8s.Delete(h.ctx, back); err != nil {
		t.Fatal(err)
	}
	recreated := wait("re-created after deletion", func(cs *v1beta1.ConfigurationState, c *metav1.Condition) bool {
		return cs.UID != back.UID && cs.Status.Result == v1beta1.ConfigurationResultValid && cs.Labels[v1beta1.LabelComponentType] == configstate.ComponentController
	})
	t.Logf("re-created: %s", describeState(recreated))
}

// A reporter writes once per change of verdict: reporting the same verdict
// again leaves the object untouched, and a new message under the same status
// keeps lastTransitionTime.
func TestConfigurationStateWrittenOncePerChange(t *testing.T) {
	h := newHarness(t)
	verdict := error(nil)
	r := &configstate.Reporter{
		Client: k8s, Namespace: h.installNS, Name: "speaker-w1",
		Labels:    configstate.SpeakerLabels("w1"),
		Condition: configstate.ConditionConfigReconcilerValid,
		Check:     func(context.Context) (error, error) { return verdict, nil },
	}
	key := client.ObjectKey{Namespace: h.installNS, Name: "speaker-w1"}
	report := func() *v1beta1.ConfigurationState {
		t.Helper()
		if _, err := r.Reconcile(h.ctx, reconcile.Request{NamespacedName: key}); err != nil {
			t.Fatal(err)
		}
		var cs v1beta1.ConfigurationState
		if err := k8s.Get(h.ctx, key, &cs); err != nil {
			t.Fatal(err)
		}
		return &cs
	}

	first := report()
	if first.Status.Result != v1beta1.ConfigurationResultValid || first.Labels[v1beta1.LabelNodeName] != "w1" {
		t.Fatalf("first report: %s", describeState(first))
	}
	if again := report(); again.ResourceVersion != first.ResourceVersion {
		t.Errorf("the same verdict was written again: resourceVersion %s -> %s", first.ResourceVersion, again.ResourceVersion)
	}

	verdict = errors.New(`L2Advertisement "a": spec.preferredNodeSelectors[0].weight: weight 0 is out of range: want 1 to 100`)
	bad := report()
	if bad.Status.Result != v1beta1.ConfigurationResultInvalid || bad.Status.ErrorSummary != verdict.Error() || bad.ResourceVersion == first.ResourceVersion {
		t.Fatalf("invalid verdict: %s", describeState(bad))
	}
	if again := report(); again.ResourceVersion != bad.ResourceVersion {
		t.Errorf("the same invalid verdict was written again")
	}
	verdict = errors.New("another problem")
	other := report()
	c0, c1 := bad.Status.Conditions[0], other.Status.Conditions[0]
	if other.Status.ErrorSummary != "another problem" || c1.Message != "another problem" || !c1.LastTransitionTime.Equal(&c0.LastTransitionTime) {
		t.Errorf("new message: %+v, want it with lastTransitionTime %v kept", c1, c0.LastTransitionTime)
	}
	verdict = nil
	if ok := report(); ok.Status.Result != v1beta1.ConfigurationResultValid || ok.Status.ErrorSummary != "" {
		t.Errorf("back to valid: %s", describeState(ok))
	}
}
