package controllers

import (
	"context"
	"crypto/rand"
	"fmt"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// MemberlistSecretKey is the data key of the memberlist Secret; the speaker mounts
// it and uses its 32 bytes as the AES-256 key for memberlist traffic (MetalLB's
// layout, so a MetalLB Secret keeps working).
const MemberlistSecretKey = "secretkey"

// +kubebuilder:rbac:groups="",namespace=metallb-system,resources=secrets,verbs=get;create
// +kubebuilder:rbac:groups=apps,namespace=metallb-system,resources=deployments,verbs=get

// memberlistSecretCheck is how often the leader checks that the memberlist
// Secret still exists. A deleted one comes back within it, with a new key:
// the speakers keep the key they loaded meanwhile (the kubelet keeps a
// mounted Secret's last content) and rotate to the new one in three phases
// (docs/security.md), and speaker Pods started meanwhile wait in
// ContainerCreating at most this long. A variable for tests.
var memberlistSecretCheck = 30 * time.Second

// memberlistSecret creates the speakers' memberlist key Secret when it does
// not exist: at leader start, and again whenever it was deleted. It reads
// through the API reader, one GET per memberlistSecretCheck, not the cache:
// caching Secrets would mean watching every Secret of the cluster.
type memberlistSecret struct {
	reader     client.Reader
	client     client.Client
	log        logr.Logger
	namespace  string
	name       string
	deployment string
}

// NeedLeaderElection makes only the leader create the Secret, so two replicas never
// race to create two different keys.
func (m *memberlistSecret) NeedLeaderElection() bool { return true }

func (m *memberlistSecret) Start(ctx context.Context) error {
	if m.name == "" {
		return nil
	}
	t := time.NewTicker(memberlistSecretCheck)
	defer t.Stop()
	lastErr := ""
	for {
		// Not fatal for allocation; the speaker reports its missing key.
		// Each distinct failure is logged once.
		if err := m.ensure(ctx); err != nil && err.Error() != lastErr {
			m.log.Error(err, "cannot create the memberlist secret", "secret", m.name)
			lastErr = err.Error()
		} else if err == nil {
			lastErr = ""
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

func (m *memberlistSecret) ensure(ctx context.Context) error {
	var existing corev1.Secret
	err := m.reader.Get(ctx, client.ObjectKey{Namespace: m.namespace, Name: m.name}, &existing)
	if err == nil {
		return nil
	}
	if !apierrors.IsNotFound(err) {
		return fmt.Errorf("reading secret %s/%s: %w", m.namespace, m.name, err)
	}
	key := make([]byte, 32)
	if _, err := rand.Read(key); err != nil {
		return fmt.Errorf("generating the memberlist key: %w", err)
	}
	secret := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: m.namespace,
			Name:      m.name,
			Labels:    map[string]string{"app.kubernetes.io/name": "ironlb", "app.kubernetes.io/component": "memberlist"},
		},
		Type: corev1.SecretTypeOpaque,
		Data: map[string][]byte{MemberlistSecretKey: key},
	}
	if m.deployment != "" {
		// Owned by the controller Deployment: uninstalling ironlb removes it.
		switch owner, err := deploymentOwner(ctx, m.reader, m.namespace, m.deployment); {
		case err != nil:
			return err
		case owner != nil:
			secret.OwnerReferences = []metav1.OwnerReference{*owner}
		default:
			m.log.Info("controller deployment not found, creating the memberlist secret without an owner",
				"deployment", m.deployment)
		}
	}
	if err := m.client.Create(ctx, secret); err != nil {
		if apierrors.IsAlreadyExists(err) {
			return nil
		}
		return fmt.Errorf("creating secret %s/%s: %w", m.namespace, m.name, err)
	}
	m.log.Info("memberlist secret created", "secret", m.name, "owner", m.deployment)
	return nil
}
