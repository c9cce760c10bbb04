package speaker

import (
	"fmt"
	"reflect"
	"testing"

	"github.com/ironlb/ironlb/internal/ownership"
)

func TestGroupChanges(t *testing.T) {
	ch := func(key, from, to string, r ownership.Reason) ownership.Change {
		return ownership.Change{Key: key, From: from, To: to, Reason: r}
	}
	down, learned := ownership.ReasonOwnerDown, ownership.ReasonLearned
	var many []ownership.Change
	for i := range changeLogChunk + 1 {
		many = append(many, ch(fmt.Sprintf("10.0.%d.%d", i/256, i%256), "c", "a", down))
	}
	for _, tc := range []struct {
		name    string
		changes []ownership.Change
		want    []changeGroup
	}{
		{name: "none"},
		{
			name:    "one",
			changes: []ownership.Change{ch("10.0.0.1", "", "a", ownership.ReasonPlaced)},
			want:    []changeGroup{{from: "", to: "a", reason: ownership.ReasonPlaced, keys: []string{"10.0.0.1"}}},
		},
		{
			name: "grouped by from, to and reason, in order of first appearance, keys in address order",
			changes: []ownership.Change{
				ch("10.0.0.3", "c", "a", down), ch("10.0.0.2", "c", "b", down),
				ch("10.0.0.10", "c", "a", down), ch("10.0.0.1", "c", "a", down), ch("10.0.0.4", "c", "a", learned),
			},
			want: []changeGroup{
				{from: "c", to: "a", reason: down, keys: []string{"10.0.0.1", "10.0.0.3", "10.0.0.10"}},
				{from: "c", to: "b", reason: down, keys: []string{"10.0.0.2"}},
				{from: "c", to: "a", reason: learned, keys: []string{"10.0.0.4"}},
			},
		},
		{
			name:    "a group over the chunk size is split",
			changes: many,
			want: []changeGroup{
				{from: "c", to: "a", reason: down, keys: keysOf(many[:changeLogChunk])},
				{from: "c", to: "a", reason: down, keys: keysOf(many[changeLogChunk:])},
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := groupChanges(tc.changes)
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("groupChanges:\n got  %+v\n want %+v", got, tc.want)
			}
		})
	}
}

func keysOf(changes []ownership.Change) []string {
	var out []string
	for _, c := range changes {
		out = append(out, c.Key)
	}
	return out
}
