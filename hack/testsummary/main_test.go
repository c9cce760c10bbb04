package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func events(lines ...string) string { return strings.Join(lines, "\n") + "\n" }

func TestSummarize(t *testing.T) {
	allow := allowed{"internal/x": {"TestOptIn"}}
	skipRoot := events(
		`{"Action":"run","Package":"m/internal/x","Test":"TestNetns"}`,
		`{"Action":"output","Package":"m/internal/x","Test":"TestNetns","Output":"    netns_test.go:10: needs root\n"}`,
		`{"Action":"skip","Package":"m/internal/x","Test":"TestNetns"}`,
		`{"Action":"run","Package":"m/internal/x","Test":"TestOptIn"}`,
		`{"Action":"skip","Package":"m/internal/x","Test":"TestOptIn"}`,
		`{"Action":"run","Package":"m/internal/x","Test":"TestFine"}`,
		`{"Action":"pass","Package":"m/internal/x","Test":"TestFine"}`,
		`{"Action":"pass","Package":"m/internal/x","Elapsed":1.5}`,
	)
	for _, tc := range []struct {
		name   string
		in     string
		strict bool
		ok     bool
		want   []string
	}{
		{"skips allowed outside CI", skipRoot, false, true, []string{"ok   m/internal/x", "1 run,    1 passed,   0 failed,   2 skipped"}},
		{"a skip for want of root fails in CI", skipRoot, true, false, []string{"FAIL m/internal/x", "SKIPPED IN CI", "TestNetns: netns_test.go:10: needs root"}},
		{"a failed test is shown", events(
			`{"Action":"run","Package":"m/y","Test":"TestBad"}`,
			`{"Action":"output","Package":"m/y","Test":"TestBad","Output":"    y_test.go:3: boom\n"}`,
			`{"Action":"fail","Package":"m/y","Test":"TestBad"}`,
			`{"Action":"fail","Package":"m/y","Elapsed":0.1}`,
		), false, false, []string{"--- FAIL m/y TestBad", "boom", "FAIL m/y", "1 run,    0 passed,   1 failed"}},
		{"a failure's last messages are repeated below its dump", events(
			`{"Action":"run","Package":"m/y","Test":"TestDump"}`,
			`{"Action":"output","Package":"m/y","Test":"TestDump","Output":"    y_test.go:7: traffic: 3 broken\n"}`,
			`{"Action":"output","Package":"m/y","Test":"TestDump","Output":"    helpers_test.go:9: cluster dump:\n"}`,
			`{"Action":"output","Package":"m/y","Test":"TestDump","Output":"        -A KUBE-SVC-X y_test.go:1: not a message\n"}`,
			`{"Action":"fail","Package":"m/y","Test":"TestDump"}`,
			`{"Action":"fail","Package":"m/y","Elapsed":0.1}`,
		), false, false, []string{"--- WHY m/y TestDump: its last messages (full output above)\n    y_test.go:7: traffic: 3 broken\n    helpers_test.go:9: cluster dump:\nFAIL m/y"}},
		{"a build failure is shown", events(
			`{"ImportPath":"m/z","Action":"build-output","Output":"z.go:1: syntax error\n"}`,
			`{"ImportPath":"m/z","Action":"build-fail"}`,
			`{"Action":"start","Package":"m/z"}`,
			`{"Action":"fail","Package":"m/z","FailedBuild":"m/z"}`,
		), false, false, []string{"z.go:1: syntax error", "FAIL m/z"}},
		{"a test running when its binary panicked is shown with its last output", events(
			`{"Action":"run","Package":"m/v","Test":"TestDone"}`,
			`{"Action":"pass","Package":"m/v","Test":"TestDone"}`,
			`{"Action":"run","Package":"m/v","Test":"TestCrash"}`,
			`{"Action":"output","Package":"m/v","Test":"TestCrash","Output":"panic: Log in goroutine after TestX has completed\n"}`,
			`{"Action":"output","Package":"m/v","Output":"FAIL\tm/v\t1.0s\n"}`,
			`{"Action":"fail","Package":"m/v","Elapsed":1}`,
		), false, false, []string{"--- DIED m/v TestCrash", "panic: Log in goroutine", "FAIL m/v", "1 run,    1 passed,   0 failed"}},
		{"a binary killed by -timeout is a failure", events(
			`{"Action":"run","Package":"m/w","Test":"TestSlow"}`,
		), false, false, []string{"FAIL m/w", "did not finish"}},
	} {
		var out bytes.Buffer
		ok, err := summarize(strings.NewReader(tc.in), &out, false, tc.strict, allow)
		if err != nil {
			t.Fatal(err)
		}
		if ok != tc.ok {
			t.Errorf("%s: ok = %v, want %v\n%s", tc.name, ok, tc.ok, out.String())
		}
		for _, w := range tc.want {
			if !strings.Contains(out.String(), w) {
				t.Errorf("%s: output lacks %q:\n%s", tc.name, w, out.String())
			}
		}
	}
}

// The committed allow file parses, and every test it lists exists in the package it
// names: a stale entry would let a new test of the same name skip unnoticed.
func TestAllowFile(t *testing.T) {
	a, err := readAllow("../ci-allowed-skips.txt")
	if err != nil {
		t.Fatal(err)
	}
	if !a.allows("github.com/ironlb/ironlb/internal/layer2", "TestWriteFuzzSeeds") || a.allows("github.com/ironlb/ironlb/internal/layer2", "TestNetns") {
		t.Errorf("allow file: %v", a)
	}
	for pkg, tests := range a {
		files, err := filepath.Glob(filepath.Join("..", "..", pkg, "*_test.go"))
		if err != nil || len(files) == 0 {
			t.Errorf("allow file: package %s has no test files (%v)", pkg, err)
			continue
		}
		var src strings.Builder
		for _, f := range files {
			b, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			src.Write(b)
		}
		for _, name := range tests {
			if !strings.Contains(src.String(), "func "+name+"(") {
				t.Errorf("allow file: %s has no test %s", pkg, name)
			}
		}
	}
}
