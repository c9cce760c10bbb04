package webhook

import (
	"net/http"
	"strings"

	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/manager"
)

// nameScopedManager hands the certificate rotator a manager whose REST config lists
// and watches only the objects it owns: cert-controller builds its own informer
// cache from mgr.GetConfig() with no field selector, which would list and watch
// every Secret of the install namespace (Helm release Secrets included) and every
// ValidatingWebhookConfiguration of the cluster. With metadata.name field selectors
// on those requests the API server authorizes them against the objects' names, so
// the chart can grant list/watch with resourceNames only.
type nameScopedManager struct {
	manager.Manager
	cfg *rest.Config
}

func scopeToNames(mgr manager.Manager, secretNamespace, secretName, webhookConfig string) manager.Manager {
	cfg := rest.CopyConfig(mgr.GetConfig())
	scopes := map[string]string{
		"/api/v1/namespaces/" + secretNamespace + "/secrets":                    secretName,
		"/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations": webhookConfig,
	}
	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper {
		return &nameScopedTransport{next: rt, scopes: scopes}
	})
	return &nameScopedManager{Manager: mgr, cfg: cfg}
}

func (m *nameScopedManager) GetConfig() *rest.Config { return m.cfg }

// nameScopedTransport adds fieldSelector=metadata.name=<name> to GET requests on
// the collection paths in scopes (list and watch; a GET of one object has a longer
// path and passes unchanged).
type nameScopedTransport struct {
	next   http.RoundTripper
	scopes map[string]string // collection path -> the one name to list
}

func (t *nameScopedTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	name, ok := t.scopes[strings.TrimSuffix(req.URL.Path, "/")]
	if !ok || req.Method != http.MethodGet {
		return t.next.RoundTrip(req)
	}
	q := req.URL.Query()
	sel := fields.OneTermEqualSelector("metadata.name", name).String()
	if old := q.Get("fieldSelector"); old != "" {
		sel = old + "," + sel
	}
	q.Set("fieldSelector", sel)
	r := req.Clone(req.Context()) // deep copy, URL included: the caller's request stays as it was
	r.URL.RawQuery = q.Encode()
	return t.next.RoundTrip(r)
}
