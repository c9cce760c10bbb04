package webhook

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"sync/atomic"
	"time"

	"github.com/open-policy-agent/cert-controller/pkg/rotator"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/manager"
)

// Defaults for CertOptions: the names the Helm chart and manifests use.
const (
	DefaultSecretName               = "ironlb-webhook-cert"
	DefaultServiceName              = "ironlb-webhook-service"
	DefaultWebhookConfigurationName = "ironlb-webhook-configuration"
)

// DefaultCertDir is where controller-runtime's webhook server looks for tls.crt and
// tls.key unless told otherwise.
var DefaultCertDir = filepath.Join(os.TempDir(), "k8s-webhook-server", "serving-certs")

// The chart narrows these to the certificate Secret and the webhook configuration
// by name (resourceNames); only create cannot be narrowed. The rotator's list and
// watch carry a metadata.name field selector (scopeToNames) so that works.
//
// +kubebuilder:rbac:groups="",namespace=metallb-system,resources=secrets,verbs=get;list;watch;create;update;patch
// +kubebuilder:rbac:groups=apps,namespace=metallb-system,resources=deployments,verbs=get
// +kubebuilder:rbac:groups=admissionregistration.k8s.io,resources=validatingwebhookconfigurations,verbs=get;list;watch;update

// CertOptions configures SetupCertRotation.
type CertOptions struct {
	// Namespace holds the Secret and the webhook Service (the install namespace).
	Namespace string
	// SecretName is the Secret that stores the CA and the serving certificate
	// (created if absent). Default DefaultSecretName.
	SecretName string
	// ServiceName is the webhook Service; the certificate is valid for
	// <ServiceName>.<Namespace>.svc. Default DefaultServiceName.
	ServiceName string
	// WebhookConfigurationName is the ValidatingWebhookConfiguration whose caBundle
	// is kept current. Default DefaultWebhookConfigurationName.
	WebhookConfigurationName string
	// CertDir is the webhook server's certificate directory (webhook.Options.CertDir).
	// Default DefaultCertDir.
	CertDir string
	// ExtraDNSNames are more names the certificate is valid for.
	ExtraDNSNames []string
	// WriteCertDir makes this process write the Secret's tls.crt and tls.key into
	// CertDir (and rewrite them after a rotation). Set it when the Secret is not
	// mounted at CertDir as a volume; leave it false when it is (the volume is
	// read-only and the kubelet keeps it current).
	WriteCertDir bool
	// RequireLeaderElection makes only the leader rotate certificates. Leave it
	// false (the default) so every replica can serve as soon as it starts.
	RequireLeaderElection bool
	// OwnerDeployment, when set, is the Deployment (in Namespace) that owns the
	// certificate Secret, so the garbage collector removes the Secret when the
	// Deployment goes (helm uninstall). A Secret that exists without any owner is
	// adopted. Empty leaves the Secret without an owner.
	OwnerDeployment string
}

// SetupCertRotation adds open-policy-agent/cert-controller's rotator to mgr: it
// creates and renews a self-signed CA and serving certificate in the Secret and
// injects the CA into the ValidatingWebhookConfiguration. The returned channel is
// closed when the certificate files are in CertDir and the CA is injected: call
// Setup (which starts the webhook server) only then, e.g.
//
//	ready, err := webhook.SetupCertRotation(mgr, opts)
//	go func() { <-ready; if err := webhook.Setup(mgr, ns); err != nil { ... } }()
//
// The rotator stops the manager with an error if the files never appear or the CA
// cannot be injected (after about 15 minutes of retries).
func SetupCertRotation(mgr manager.Manager, opts CertOptions) (<-chan struct{}, error) {
	if opts.Namespace == "" {
		return nil, errors.New("webhook certificates: namespace is empty")
	}
	if opts.SecretName == "" {
		opts.SecretName = DefaultSecretName
	}
	if opts.ServiceName == "" {
		opts.ServiceName = DefaultServiceName
	}
	if opts.WebhookConfigurationName == "" {
		opts.WebhookConfigurationName = DefaultWebhookConfigurationName
	}
	if opts.CertDir == "" {
		opts.CertDir = DefaultCertDir
	}
	ready := make(chan struct{})
	secret := types.NamespacedName{Namespace: opts.Namespace, Name: opts.SecretName}
	// The rotator fills an existing Secret but does not create one.
	if err := ensureSecret(mgr, secret, opts.OwnerDeployment); err != nil {
		return nil, fmt.Errorf("webhook certificates: %w", err)
	}
	r := &rotator.CertRotator{
		SecretKey:             secret,
		CertDir:               opts.CertDir,
		CAName:                "ironlb-ca",
		CAOrganization:        "ironlb",
		DNSName:               fmt.Sprintf("%s.%s.svc", opts.ServiceName, opts.Namespace),
		ExtraDNSNames:         append([]string{fmt.Sprintf("%s.%s.svc.cluster.local", opts.ServiceName, opts.Namespace)}, opts.ExtraDNSNames...),
		IsReady:               ready,
		Webhooks:              []rotator.WebhookInfo{{Name: opts.WebhookConfigurationName, Type: rotator.Validating}},
		RequireLeaderElection: opts.RequireLeaderElection,
		// controller-runtime refuses a second controller of the same name in one
		// process (and the rotator offers no way to skip that check), so a
		// process running a second manager, e.g. a restart in tests, gets a
		// numbered name; the first keeps the plain one its metrics are known by.
		ControllerName: rotatorName(),
	}
	if err := rotator.AddRotator(scopeToNames(mgr, secret.Namespace, secret.Name, opts.WebhookConfigurationName), r); err != nil {
		return nil, fmt.Errorf("webhook certificates: adding rotator: %w", err)
	}
	if opts.WriteCertDir {
		if err := mgr.Add(&certWriter{reader: mgr.GetAPIReader(), secret: secret, dir: opts.CertDir, needLeader: opts.RequireLeaderElection}); err != nil {
			return nil, fmt.Errorf("webhook certificates: adding certificate writer: %w", err)
		}
	}
	return ready, nil
}

var rotators atomic.Int64

// rotatorName names the n-th certificate rotator of this process.
func rotatorName() string {
	if n := rotators.Add(1); n > 1 {
		return fmt.Sprintf("ironlb-cert-rotator-%d", n)
	}
	return "ironlb-cert-rotator"
}

// ensureSecret creates the empty certificate Secret when the install manifests did
// not, so the rotator has something to fill, owned by the Deployment named owner
// (if any). Another replica creating it first is fine. An existing Secret without
// owner is given one; its data is left alone.
func ensureSecret(mgr manager.Manager, key types.NamespacedName, owner string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := client.New(mgr.GetConfig(), client.Options{Scheme: mgr.GetScheme(), Mapper: mgr.GetRESTMapper()})
	if err != nil {
		return fmt.Errorf("creating client: %w", err)
	}
	log := mgr.GetLogger().WithName("webhook-cert").WithValues("secret", key.String())
	var refs []metav1.OwnerReference
	if owner != "" {
		var dep appsv1.Deployment
		switch err := c.Get(ctx, types.NamespacedName{Namespace: key.Namespace, Name: owner}, &dep); {
		case err == nil:
			refs = []metav1.OwnerReference{{
				APIVersion: "apps/v1", Kind: "Deployment", Name: dep.Name, UID: dep.UID,
				// false: needs no permission on the Deployment's finalizers.
				BlockOwnerDeletion: ptr.To(false), Controller: ptr.To(false),
			}}
		case apierrors.IsNotFound(err):
			log.Info("owner deployment not found, the certificate secret stays without an owner", "deployment", owner)
		default:
			return fmt.Errorf("reading deployment %s/%s: %w", key.Namespace, owner, err)
		}
	}
	var s corev1.Secret
	err = c.Get(ctx, key, &s)
	switch {
	case err == nil:
		if len(refs) == 0 || len(s.OwnerReferences) > 0 {
			return nil
		}
		// A merge patch without resourceVersion: it cannot conflict with the
		// rotator of another replica writing the data meanwhile.
		patch := client.RawPatch(types.MergePatchType, mustOwnerPatch(refs))
		if err := c.Patch(ctx, &s, patch); err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("setting the owner of secret %s to deployment %s: %w", key, owner, err)
		}
		log.Info("certificate secret adopted by the controller deployment", "deployment", owner)
		return nil
	case !apierrors.IsNotFound(err):
		return fmt.Errorf("reading secret %s: %w", key, err)
	}
	s = corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name, OwnerReferences: refs,
		Labels: map[string]string{"app.kubernetes.io/name": "ironlb", "app.kubernetes.io/component": "webhook"}}}
	if err := c.Create(ctx, &s); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("creating secret %s: %w", key, err)
	}
	return nil
}

func mustOwnerPatch(refs []metav1.OwnerReference) []byte {
	b, err := json.Marshal(map[string]any{"metadata": map[string]any{"ownerReferences": refs}})
	if err != nil {
		panic(err) // plain structs always marshal
	}
	return b
}

// Checker is a readiness check that fails until ready is closed and then reports
// whether the webhook server of mgr is serving. Use it instead of
// mgr.GetWebhookServer().StartedChecker(), which would start the server before its
// certificates exist.
func Checker(mgr manager.Manager, ready <-chan struct{}) healthz.Checker {
	return func(req *http.Request) error {
		select {
		case <-ready:
			return mgr.GetWebhookServer().StartedChecker()(req)
		default:
			return errors.New("webhook certificates not ready yet")
		}
	}
}

// certWriter keeps CertDir's tls.crt and tls.key equal to the Secret's, for
// processes that do not get the Secret mounted as a volume. controller-runtime's
// certificate watcher reloads the files when they change.
type certWriter struct {
	reader     client.Reader
	secret     types.NamespacedName
	dir        string
	needLeader bool
}

func (w *certWriter) NeedLeaderElection() bool { return w.needLeader }

// Start polls quickly until the first certificate is written, then slowly: a
// rotation is scheduled long before the old certificate expires.
func (w *certWriter) Start(ctx context.Context) error {
	log := logf.FromContext(ctx).WithValues("secret", w.secret.String(), "certDir", w.dir)
	written := false
	poll := func(ctx context.Context) {
		changed, err := w.sync(ctx)
		switch {
		case err != nil:
			log.V(1).Info("webhook certificate not written yet", "reason", err.Error())
		case changed:
			written = true
			log.Info("wrote webhook serving certificate")
		default:
			written = true
		}
	}
	for !written {
		poll(ctx)
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(500 * time.Millisecond):
		}
	}
	wait.UntilWithContext(ctx, poll, 30*time.Second)
	return nil
}

func (w *certWriter) sync(ctx context.Context) (bool, error) {
	var s corev1.Secret
	if err := w.reader.Get(ctx, w.secret, &s); err != nil {
		return false, err
	}
	crt, key := s.Data[corev1.TLSCertKey], s.Data[corev1.TLSPrivateKeyKey]
	if len(crt) == 0 || len(key) == 0 {
		return false, fmt.Errorf("secret %s has no %s/%s yet", w.secret, corev1.TLSCertKey, corev1.TLSPrivateKeyKey)
	}
	if err := os.MkdirAll(w.dir, 0o700); err != nil {
		return false, err
	}
	// Key first: the watcher reloads on the certificate's change and needs the
	// matching key in place by then.
	k, err := writeIfChanged(filepath.Join(w.dir, corev1.TLSPrivateKeyKey), key, 0o600)
	if err != nil {
		return false, err
	}
	c, err := writeIfChanged(filepath.Join(w.dir, corev1.TLSCertKey), crt, 0o644)
	return k || c, err
}

// writeIfChanged replaces path atomically (temporary file and rename) when its
// content differs.
func writeIfChanged(path string, data []byte, mode os.FileMode) (bool, error) {
	if old, err := os.ReadFile(path); err == nil && bytes.Equal(old, data) {
		return false, nil
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return false, err
	}
	// Fails harmlessly (not found) after a successful rename; otherwise removes the leftover.
	defer func() { _ = os.Remove(tmp.Name()) }()
	if _, err := tmp.Write(data); err != nil {
		_ = tmp.Close() // the write error is the one to report; the file is removed anyway
		return false, err
	}
	if err := tmp.Chmod(mode); err != nil {
		_ = tmp.Close() // as above
		return false, err
	}
	if err := tmp.Close(); err != nil {
		return false, err
	}
	return true, os.Rename(tmp.Name(), path)
}
