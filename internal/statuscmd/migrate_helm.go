package statuscmd

import (
	"bytes"
	"compress/gzip"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/restmapper"
	"sigs.k8s.io/yaml"
)

// A MetalLB installed with Helm is removed from its release record: every
// object of the release but its CRDs (and a Namespace, should the chart hold
// one), then the record itself. `helm uninstall` would delete the CRDs, and
// with them every pool: Helm reads helm.sh/resource-policy from the manifest
// it stored at install time, not from the objects, so annotating them keeps
// nothing.

// helmReleaseManifest decodes the manifest of a Helm 3 release Secret's
// "release" value: base64 of gzipped JSON.
func helmReleaseManifest(data []byte) (string, error) {
	raw, err := base64.StdEncoding.DecodeString(string(data))
	if err != nil {
		return "", fmt.Errorf("base64: %w", err)
	}
	zr, err := gzip.NewReader(bytes.NewReader(raw))
	if err != nil {
		return "", fmt.Errorf("gzip: %w", err)
	}
	js, err := io.ReadAll(zr)
	if err != nil {
		return "", fmt.Errorf("gzip: %w", err)
	}
	var rel struct {
		Manifest string `json:"manifest"`
	}
	if err := json.Unmarshal(js, &rel); err != nil {
		return "", fmt.Errorf("release JSON: %w", err)
	}
	return rel.Manifest, nil
}

// releaseObjects splits a release manifest into its objects, leaving out
// CRDs and Namespaces (they stay).
func releaseObjects(manifest string) ([]*unstructured.Unstructured, error) {
	var out []*unstructured.Unstructured
	for _, doc := range strings.Split("\n"+manifest, "\n---") {
		if strings.TrimSpace(doc) == "" {
			continue
		}
		u := &unstructured.Unstructured{}
		if err := yaml.Unmarshal([]byte(doc), &u.Object); err != nil {
			return nil, fmt.Errorf("release manifest: %w", err)
		}
		if len(u.Object) == 0 || u.GetKind() == "CustomResourceDefinition" || u.GetKind() == "Namespace" {
			continue
		}
		out = append(out, u)
	}
	return out, nil
}

// removeHelmRelease deletes every object of MetalLB's Helm release but its
// CRDs and Namespace, then the release's records (its Secrets, every
// revision). It returns what it deleted.
func (m *migration) removeHelmRelease(release string) ([]string, error) {
	ns := m.o.namespace
	sel := metav1.ListOptions{LabelSelector: "owner=helm,name=" + release}
	secrets, err := m.cs.CoreV1().Secrets(ns).List(m.ctx, sel)
	if err != nil {
		return nil, fmt.Errorf("listing the records of Helm release %s: %w", release, err)
	}
	if len(secrets.Items) == 0 {
		return nil, nil // already gone
	}
	latest := slices.MaxFunc(secrets.Items, func(a, b corev1.Secret) int {
		va, _ := strconv.Atoi(a.Labels["version"])
		vb, _ := strconv.Atoi(b.Labels["version"])
		return va - vb
	})
	manifest, err := helmReleaseManifest(latest.Data["release"])
	if err != nil {
		return nil, fmt.Errorf("reading Helm release %s (Secret %s): %w", release, latest.Name, err)
	}
	objs, err := releaseObjects(manifest)
	if err != nil {
		return nil, fmt.Errorf("the Helm release %s: %w", release, err)
	}
	mapper := restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(m.cs.Discovery()))
	bg := metav1.DeletePropagationBackground
	var deleted []string
	for _, o := range objs {
		gvk := o.GroupVersionKind()
		mp, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
		if meta.IsNoMatchError(err) {
			continue // its kind is not served any more: nothing left to delete
		}
		if err != nil {
			return deleted, fmt.Errorf("the Helm release %s: %s %s: %w", release, gvk.Kind, o.GetName(), err)
		}
		r := m.dc.Resource(mp.Resource)
		var del func() error
		if mp.Scope.Name() == meta.RESTScopeNameNamespace {
			ons := o.GetNamespace()
			if ons == "" {
				ons = ns
			}
			del = func() error {
				return r.Namespace(ons).Delete(m.ctx, o.GetName(), metav1.DeleteOptions{PropagationPolicy: &bg})
			}
		} else {
			del = func() error { return r.Delete(m.ctx, o.GetName(), metav1.DeleteOptions{PropagationPolicy: &bg}) }
		}
		switch err := del(); {
		case err == nil:
			deleted = append(deleted, gvk.Kind+" "+o.GetName())
		case !apierrors.IsNotFound(err):
			return deleted, fmt.Errorf("deleting %s %s of Helm release %s: %w", gvk.Kind, o.GetName(), release, err)
		}
	}
	for _, s := range secrets.Items {
		if err := m.cs.CoreV1().Secrets(ns).Delete(m.ctx, s.Name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			return deleted, fmt.Errorf("deleting the record %s of Helm release %s: %w", s.Name, release, err)
		}
	}
	return append(deleted, fmt.Sprintf("the record of Helm release %s (revisions: %d)", release, len(secrets.Items))), nil
}
