package speaker

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/go-logr/logr"
)

// TestStartManagerDoesNotHang: a manager Start that ignores cancellation (as
// controller-runtime's does while its caches never sync) does not keep the
// speaker from stopping; errors of a Start that does return are passed on.
func TestStartManagerDoesNotHang(t *testing.T) {
	stuck := make(chan struct{})
	defer close(stuck)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	err := startManager(ctx, logr.Discard(), func(context.Context) error { <-stuck; return nil }, 10*time.Millisecond)
	if err != nil {
		t.Errorf("stuck manager: err = %v, want nil (stop without it)", err)
	}

	boom := errors.New("boom")
	err = startManager(context.Background(), logr.Discard(), func(context.Context) error { return boom }, time.Hour)
	if !errors.Is(err, boom) {
		t.Errorf("failing manager: err = %v, want %v", err, boom)
	}
}
