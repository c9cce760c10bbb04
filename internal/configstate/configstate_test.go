package configstate

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ironlb/ironlb/api/v1beta1"
	"github.com/ironlb/ironlb/internal/config"
)

func TestStatus(t *testing.T) {
	t1 := metav1.NewTime(time.Date(2026, 11, 24, 12, 0, 0, 0, time.UTC))
	t2 := metav1.NewTime(t1.Add(time.Minute))
	valid := Status(v1beta1.ConfigurationStateStatus{}, ConditionConfigReconcilerValid, nil, t1)
	if valid.Result != v1beta1.ConfigurationResultValid || valid.ErrorSummary != "" || len(valid.Conditions) != 1 ||
		valid.Conditions[0].Reason != ReasonReconciled || valid.Conditions[0].Status != metav1.ConditionTrue {
		t.Fatalf("valid: %+v", valid)
	}
	if again := Status(valid, ConditionConfigReconcilerValid, nil, t2); again.Conditions[0].LastTransitionTime != t1 {
		t.Errorf("same verdict moved lastTransitionTime to %v", again.Conditions[0].LastTransitionTime)
	}

	// Another writer's False condition makes the object Invalid, with its
	// message in the summary; ours stays True.
	other := Status(valid, "otherValid", errors.New("other problem"), t2)
	if other.Result != v1beta1.ConfigurationResultInvalid || other.ErrorSummary != "other problem" || len(other.Conditions) != 2 {
		t.Fatalf("two conditions: %+v", other)
	}
	both := Status(other, ConditionConfigReconcilerValid, errors.New("mine"), t2)
	if both.ErrorSummary != "mine\nother problem" {
		t.Errorf("summary %q, want both messages in condition-type order", both.ErrorSummary)
	}
	if valid.Result != v1beta1.ConfigurationResultValid || len(valid.Conditions) != 1 {
		t.Errorf("Status modified its input: %+v", valid)
	}

	huge := Status(valid, ConditionConfigReconcilerValid, errors.New(strings.Repeat("x", 3*maxMessage)), t2)
	if n := len(huge.Conditions[0].Message); n > maxMessage || !strings.HasSuffix(huge.Conditions[0].Message, "...") || len(huge.ErrorSummary) > maxMessage {
		t.Errorf("message of %d bytes, summary %d: want both bounded to %d", n, len(huge.ErrorSummary), maxMessage)
	}
}

func TestIsConfigError(t *testing.T) {
	parseErr := errors.Join(&config.FieldError{Kind: "IPAddressPool", Name: "p", Field: "spec.addresses[0]", Err: errors.New("bad")})
	if !IsConfigError(parseErr) || !IsConfigError(fmt.Errorf("wrapped: %w", parseErr)) {
		t.Error("a parser error is not recognised")
	}
	if IsConfigError(errors.New("listing IPAddressPools: connection refused")) || IsConfigError(nil) {
		t.Error("a read failure counts as a configuration error")
	}
}
