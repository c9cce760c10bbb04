package speaker

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/ironlb/ironlb/api/v1beta1"
	"github.com/ironlb/ironlb/internal/configstate"
)

// TestSpeakerConfigurationState: a speaker writes speaker-<node>, owned by
// the DaemonSet that runs it and labelled as MetalLB labels it; an overlapping pool (no webhook
// here) turns it Invalid naming the pool, removing the pool turns it back.
func TestSpeakerConfigurationState(t *testing.T) {
	if testing.Short() {
		t.Skip("envtest: skipped in -short mode")
	}
	cfg, c, _ := startEnv(t)
	nodes, _, _ := seed(t, c)
	ctx := context.Background()
	labels := map[string]string{"app": "speaker"}
	ds := &appsv1.DaemonSet{ObjectMeta: metav1.ObjectMeta{Namespace: testNS, Name: "ironlb-speaker"},
		Spec: appsv1.DaemonSetSpec{Selector: &metav1.LabelSelector{MatchLabels: labels}, Template: corev1.PodTemplateSpec{
			ObjectMeta: metav1.ObjectMeta{Labels: labels},
			Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "speaker", Image: "ghcr.io/ironlb/ironlb"}}}}}}
	create(t, c, ds)
	var pod corev1.Pod
	if err := c.Get(ctx, client.ObjectKey{Namespace: testNS, Name: "speaker-w1"}, &pod); err != nil {
		t.Fatal(err)
	}
	pod.OwnerReferences = []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "DaemonSet", Name: ds.Name, UID: ds.UID, Controller: ptr.To(true)}}
	if err := c.Update(ctx, &pod); err != nil {
		t.Fatal(err)
	}
	stop, _ := runSpeaker(t, cfg, "w1", nodes["w1"], freeUDPTCPPort(t, nodes["w1"]))
	defer stop()

	key := client.ObjectKey{Namespace: testNS, Name: configstate.SpeakerName("w1")}
	wait := func(what string, ok func(cs *v1beta1.ConfigurationState, c *metav1.Condition) bool) {
		t.Helper()
		eventually(t, what, 60*time.Second, func() string {
			var cs v1beta1.ConfigurationState
			if err := c.Get(ctx, key, &cs); err != nil {
				return err.Error()
			}
			cond := meta.FindStatusCondition(cs.Status.Conditions, configstate.ConditionConfigReconcilerValid)
			if cond != nil && ok(&cs, cond) {
				return ""
			}
			return fmt.Sprintf("result=%q summary=%q conditions=%+v labels=%v owners=%v",
				cs.Status.Result, cs.Status.ErrorSummary, cs.Status.Conditions, cs.Labels, cs.OwnerReferences)
		})
	}
	wait("speaker-w1 Valid, labelled, owned by the speaker DaemonSet", func(cs *v1beta1.ConfigurationState, cond *metav1.Condition) bool {
		return cs.Status.Result == v1beta1.ConfigurationResultValid && cond.Reason == configstate.ReasonReconciled &&
			cs.Labels[v1beta1.LabelComponentType] == configstate.ComponentSpeaker && cs.Labels[v1beta1.LabelNodeName] == "w1" &&
			len(cs.OwnerReferences) == 1 && cs.OwnerReferences[0].Kind == "DaemonSet" && cs.OwnerReferences[0].UID == ds.UID
	})

	overlap := &v1beta1.IPAddressPool{ObjectMeta: metav1.ObjectMeta{Namespace: testNS, Name: "overlap"},
		Spec: v1beta1.IPAddressPoolSpec{Addresses: []string{"172.18.255.240/28"}}}
	create(t, c, overlap)
	wait("Invalid naming the overlapping pool", func(cs *v1beta1.ConfigurationState, cond *metav1.Condition) bool {
		return cs.Status.Result == v1beta1.ConfigurationResultInvalid && cond.Status == metav1.ConditionFalse &&
			cond.Reason == configstate.ReasonConfigurationError &&
			// Which of the two is named first follows creation time, in
			// whole seconds, then the name: either may be.
			strings.Contains(cs.Status.ErrorSummary, `overlaps with already defined CIDR`) &&
			strings.Contains(cs.Status.ErrorSummary, `"overlap"`) && strings.Contains(cs.Status.ErrorSummary, `"p1"`)
	})
	if err := c.Delete(ctx, overlap); err != nil {
		t.Fatal(err)
	}
	wait("Valid again", func(cs *v1beta1.ConfigurationState, cond *metav1.Condition) bool {
		return cs.Status.Result == v1beta1.ConfigurationResultValid && cond.Status == metav1.ConditionTrue && cs.Status.ErrorSummary == ""
	})
}
