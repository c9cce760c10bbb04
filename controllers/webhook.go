package controllers

import (
	"context"
	"fmt"

	"sigs.k8s.io/controller-runtime/pkg/manager"

	ironwebhook "github.com/ironlb/ironlb/internal/webhook"
)

// setupWebhooks adds the certificate rotation and, once the certificate is in
// place, the validating webhooks. Both run on every replica, leader or not, so a
// standby replica behind the webhook Service answers admission requests too.
func setupWebhooks(mgr manager.Manager, opts Options) error {
	ready, err := ironwebhook.SetupCertRotation(mgr, ironwebhook.CertOptions{
		Namespace:                opts.Namespace,
		SecretName:               opts.WebhookSecretName,
		ServiceName:              opts.WebhookServiceName,
		WebhookConfigurationName: opts.WebhookConfigurationName,
		CertDir:                  opts.WebhookCertDir,
		WriteCertDir:             opts.WebhookWriteCerts,
	})
	if err != nil {
		return fmt.Errorf("setting up webhook certificate rotation: %w", err)
	}
	if err := mgr.AddReadyzCheck("webhook", ironwebhook.Checker(mgr, ready)); err != nil {
		return fmt.Errorf("adding the webhook readiness check: %w", err)
	}
	// The webhook server starts when the webhooks are registered, and it needs its
	// certificate files by then.
	return mgr.Add(manager.RunnableFunc(func(ctx context.Context) error {
		select {
		case <-ready:
		case <-ctx.Done():
			return nil
		}
		if err := ironwebhook.Setup(mgr, opts.Namespace); err != nil {
			return fmt.Errorf("registering the validating webhooks: %w", err)
		}
		mgr.GetLogger().Info("validating webhooks registered", "port", opts.WebhookPort)
		return nil
	}))
}
