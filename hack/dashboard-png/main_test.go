package main

import (
	"testing"

	"gonum.org/v1/plot/plotter"
)

func TestLegend(t *testing.T) {
	m := map[string]string{"ip": "172.18.255.200", "node": "myk8s-worker"}
	if got := legend("{{ip}} on {{ node }}", m); got != "172.18.255.200 on myk8s-worker" {
		t.Errorf("legend = %q", got)
	}
	if got := legend("held nodes", m); got != "held nodes" {
		t.Errorf("legend without variables = %q", got)
	}
}

func TestSegments(t *testing.T) {
	pts := plotter.XYs{{X: 0}, {X: 2}, {X: 4}, {X: 20}, {X: 40}, {X: 42}}
	segs := segments(pts)
	if len(segs) != 3 || len(segs[0]) != 3 || len(segs[1]) != 2 || len(segs[2]) != 2 {
		t.Errorf("segments = %v, want [0 2 4] [20 (+1)] [40 42]", segs)
	}
}
