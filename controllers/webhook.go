package controllers

import (
	"context"

	"sigs.k8s.io/controller-runtime/pkg/manager"
)

// setupWebhooks registers the validating webhooks and their certificate rotation.
func setupWebhooks(ctx context.Context, mgr manager.Manager, opts Options) error {
	return nil
}
