package main

import (
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/ironlb/ironlb/controllers"
	ironwebhook "github.com/ironlb/ironlb/internal/webhook"
)

func newCleanupCommand() *cobra.Command {
	var (
		namespace, deployment, lbClass, mlSecret, webhookSecret, kubeconfig string
		timeout                                                             time.Duration
	)
	cmd := &cobra.Command{
		Use:   "cleanup",
		Short: "Release every IP ironlb allocated and delete what it created (run before uninstalling)",
		Long: `cleanup undoes what ironlb did, for an uninstall (the Helm chart runs it as a pre-delete hook):

 1. scales the controller Deployment to 0 and waits until its pods are gone, so nothing
    allocates again;
 2. clears status.loadBalancer.ingress and removes the metallb.io/ip-allocated-from-pool
    annotation on every Service that carries that annotation and has our --lb-class;
 3. deletes the ServiceL2Status objects in the install namespace and the memberlist and
    webhook certificate Secrets.

It prints each step, and running it again is harmless.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := restConfig(kubeconfig)
			if err != nil {
				return err
			}
			opts := controllers.CleanupOptions{
				RESTConfig:           cfg,
				Namespace:            firstNonEmpty(namespace, os.Getenv("METALLB_NAMESPACE"), readFile(serviceAccountNamespaceFile)),
				DeploymentName:       firstNonEmpty(deployment, os.Getenv("METALLB_DEPLOYMENT")),
				LoadBalancerClass:    lbClass,
				MemberlistSecretName: mlSecret,
				WebhookSecretName:    webhookSecret,
				Timeout:              timeout,
				Out:                  cmd.OutOrStdout(),
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			return controllers.Cleanup(ctx, opts)
		},
	}
	f := cmd.Flags()
	f.StringVar(&namespace, "namespace", "", "install namespace (default: $METALLB_NAMESPACE, else the pod's namespace)")
	f.StringVar(&deployment, "deployment", "", "controller Deployment to scale to 0 first; empty skips that step (default: $METALLB_DEPLOYMENT)")
	f.StringVar(&lbClass, "lb-class", "", "the controller's --lb-class: release only Services of this spec.loadBalancerClass (empty: Services without a class)")
	f.StringVar(&mlSecret, "ml-secret-name", controllers.DefaultMemberlistName, "memberlist key Secret to delete; empty keeps it")
	f.StringVar(&webhookSecret, "webhook-secret", ironwebhook.DefaultSecretName, "webhook certificate Secret to delete; empty keeps it")
	f.StringVar(&kubeconfig, "kubeconfig", "", "kubeconfig file; default: $KUBECONFIG, the in-cluster service account, then ~/.kube/config")
	f.DurationVar(&timeout, "timeout", controllers.DefaultCleanupTimeout, "how long to wait for the controller's pods to terminate")
	return cmd
}
