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
		OwnerDeployment:          opts.DeploymentName,
	})
	if err != nil {
		return fmt.Errorf("setting up webhook certificate rotation: %w", err)
	}
	// Ready only once the handlers are registered: the server would answer 404
	// for the webhook paths before that, and the API server would reject pools.
	registered := make(chan struct{})
	if err := mgr.AddReadyzCheck("webhook", ironwebhook.Checker(mgr, registered)); err != nil {
		return fmt.Errorf("adding the webhook readiness check: %w", err)
	}
	// The webhook server starts when the webhooks are registered, and it needs its
	// certificate files by then. The registration must run on every replica: a
	// plain RunnableFunc would run only on the leader, and a standby replica would
	// serve its (started) webhook server with no handlers.
	return mgr.Add(everyReplica(func(ctx context.Context) error {
		select {
		case <-ready:
		case <-ctx.Done():
			return nil
		}
		if err := ironwebhook.Setup(mgr, opts.Namespace); err != nil {
			return fmt.Errorf("registering the validating webhooks: %w", err)
		}
		close(registered)
		mgr.GetLogger().Info("validating webhooks registered", "port", opts.WebhookPort)
		return nil
	}))
}

// everyReplica is a runnable that runs whether or not this replica is the
// leader (controller-runtime runs runnables that do not say so only on the
// leader).
type everyReplica func(ctx context.Context) error

func (f everyReplica) Start(ctx context.Context) error { return f(ctx) }

func (everyReplica) NeedLeaderElection() bool { return false }
