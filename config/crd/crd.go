// Package crd embeds ironlb's CustomResourceDefinitions as controller-gen
// writes them (bases/, copied into charts/ironlb/crds by make manifests), so
// that tools can apply the exact schemas the chart installs:
// `kubectl ironlb migrate-from-metallb prepare` upgrades MetalLB's CRDs to
// them in place, keeping the objects.
package crd

import (
	"embed"
	"fmt"
	"io/fs"
	"slices"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"
)

//go:embed bases/*.yaml
var bases embed.FS

// Objects returns every CRD, sorted by file name.
func Objects() ([]*unstructured.Unstructured, error) {
	names, err := fs.Glob(bases, "bases/*.yaml")
	if err != nil {
		return nil, err
	}
	slices.Sort(names)
	out := make([]*unstructured.Unstructured, 0, len(names))
	for _, n := range names {
		b, err := bases.ReadFile(n)
		if err != nil {
			return nil, err
		}
		u := &unstructured.Unstructured{}
		if err := yaml.Unmarshal(b, &u.Object); err != nil {
			return nil, fmt.Errorf("%s: %w", n, err)
		}
		out = append(out, u)
	}
	return out, nil
}
