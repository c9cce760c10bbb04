package election

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"sigs.k8s.io/yaml"

	"github.com/ironlb/ironlb/api/v1beta1"
	"github.com/ironlb/ironlb/internal/config"
)

// TestPreferredNodesExample parses examples/preferred-nodes as a user would
// apply it and checks the scores it documents.
func TestPreferredNodesExample(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join("..", "..", "examples", "preferred-nodes", "l2advertisement.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var pools []v1beta1.IPAddressPool
	var ads []v1beta1.L2Advertisement
	for _, doc := range strings.Split(string(raw), "\n---\n") {
		var meta struct{ Kind string }
		if err := yaml.Unmarshal([]byte(doc), &meta); err != nil {
			t.Fatal(err)
		}
		switch meta.Kind {
		case "IPAddressPool":
			var p v1beta1.IPAddressPool
			if err := yaml.UnmarshalStrict([]byte(doc), &p); err != nil {
				t.Fatal(err)
			}
			pools = append(pools, p)
		case "L2Advertisement":
			var a v1beta1.L2Advertisement
			if err := yaml.UnmarshalStrict([]byte(doc), &a); err != nil {
				t.Fatal(err)
			}
			ads = append(ads, a)
		default:
			t.Fatalf("unexpected kind %q", meta.Kind)
		}
	}
	cfg, err := config.Parse(pools, ads, nil)
	if err != nil {
		t.Fatal(err)
	}
	res := Eligible(Input{
		Service: svc(corev1.ServiceExternalTrafficPolicyCluster, nil, nil), Pool: "edge-pool", Advertisements: cfg.L2Advertisements,
		Nodes: nodes(
			node("edge-a", map[string]string{"node-role": "edge", "zone": "primary"}, false),
			node("edge-b", map[string]string{"node-role": "edge"}, false),
			node("worker-a", map[string]string{"zone": "primary"}, false),
			node("worker-b", nil, false),
		),
		EndpointSlices: []*discoveryv1.EndpointSlice{slice(ep{node: "worker-b", ready: ptr(true)})},
	})
	if want := map[string]int64{"edge-a": 150, "edge-b": 100, "worker-a": 50}; !reflect.DeepEqual(res.Scores, want) {
		t.Errorf("scores %v, want %v", res.Scores, want)
	}
	if len(res.Nodes) != 4 {
		t.Errorf("eligible %v, want every node (preferences are soft)", res.Nodes)
	}
}
