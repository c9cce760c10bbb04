package crd

import "testing"

func TestObjects(t *testing.T) {
	objs, err := Objects()
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]bool{
		"ipaddresspools.metallb.io": true, "l2advertisements.metallb.io": true,
		"servicel2statuses.metallb.io": true, "configurationstates.metallb.io": true,
	}
	for _, o := range objs {
		if o.GetKind() != "CustomResourceDefinition" || !want[o.GetName()] {
			t.Errorf("unexpected object %s %s", o.GetKind(), o.GetName())
		}
		delete(want, o.GetName())
	}
	if len(want) != 0 {
		t.Errorf("missing CRDs: %v", want)
	}
}
