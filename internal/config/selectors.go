package config

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/selection"
)

// parseSelectors converts a list of label selectors, rejecting invalid ones and
// duplicates (two selectors that select the same way, however they are written).
// field is the JSON path of the list, e.g. "spec.nodeSelectors".
func parseSelectors(e *errs, field string, in []metav1.LabelSelector) []labels.Selector {
	name := field[strings.LastIndex(field, ".")+1:]
	out := make([]labels.Selector, 0, len(in))
	seen := make(map[string]int, len(in))
	for i := range in {
		path := fmt.Sprintf("%s[%d]", field, i)
		sel, err := parseSelector(&in[i])
		if err != nil {
			e.add(path, "invalid %s %s: %w", name, selectorText(&in[i]), err)
			continue
		}
		key := canonical(sel)
		if j, dup := seen[key]; dup {
			e.add(path, "duplicate definition of %s %q (same as %s[%d])", name, key, field, j)
			continue
		}
		seen[key] = i
		out = append(out, sel)
	}
	return out
}

// parseSelector converts one selector after the checks the conversion does not
// make: a match expression given twice, or a value listed twice in one expression.
func parseSelector(ls *metav1.LabelSelector) (labels.Selector, error) {
	exprs := make(map[string]bool, len(ls.MatchExpressions))
	for _, x := range ls.MatchExpressions {
		vals := slices.Clone(x.Values)
		slices.Sort(vals)
		if i := firstDuplicate(vals); i >= 0 {
			return nil, fmt.Errorf("duplicate value %q in match expression on key %q", vals[i], x.Key)
		}
		k := x.Key + "\x00" + string(x.Operator) + "\x00" + strings.Join(vals, "\x00")
		if exprs[k] {
			return nil, fmt.Errorf("duplicate match expression {key: %q, operator: %q, values: %q}", x.Key, x.Operator, x.Values)
		}
		exprs[k] = true
	}
	return metav1.LabelSelectorAsSelector(ls)
}

func firstDuplicate(sorted []string) int {
	for i := 1; i < len(sorted); i++ {
		if sorted[i] == sorted[i-1] {
			return i
		}
	}
	return -1
}

// canonical is a selector's text with equivalent forms unified ("k in (v)" is
// "k=v") and requirements in a fixed order, so equal selectors written differently
// compare equal. The empty selector is "".
func canonical(sel labels.Selector) string {
	reqs, _ := sel.Requirements()
	parts := make([]string, len(reqs))
	for i := range reqs {
		r := &reqs[i]
		vals := r.ValuesUnsorted()
		slices.Sort(vals)
		switch op := r.Operator(); {
		case len(vals) == 1 && (op == selection.Equals || op == selection.DoubleEquals || op == selection.In):
			parts[i] = r.Key() + "=" + vals[0]
		case len(vals) == 1 && (op == selection.NotEquals || op == selection.NotIn):
			parts[i] = r.Key() + "!=" + vals[0]
		default:
			parts[i] = r.String()
		}
	}
	slices.Sort(parts)
	return strings.Join(parts, ",")
}

// selectorText renders a selector as written, for error messages.
func selectorText(ls *metav1.LabelSelector) string {
	b, err := json.Marshal(ls)
	if err != nil {
		return fmt.Sprintf("%+v", *ls)
	}
	return string(b)
}
