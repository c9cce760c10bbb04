// Command testsummary reads `go test -json` on stdin and prints, per package, one
// line with the number of tests run, passed, failed and skipped, the output of
// every failed test, and build errors. It exits non-zero when a test or a build
// failed. Below the failed tests' output it repeats each one's last messages
// (t.Log, t.Error, t.Fatal heads): failure dumps are long, and a CI log that
// keeps only its tail must still show why a test failed.
//
// With -strict (the default when CI=true, as .ci/run sets), a skipped test fails the
// run too, unless it is listed in the allow file (-allow, default
// hack/ci-allowed-skips.txt) with the reason it may skip in CI: a test that skips
// for want of root, namespaces, envtest binaries or a tool would otherwise let CI
// go green without running it.
package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"regexp"
	"slices"
	"strings"
	"time"
)

// event is one line of `go test -json` (cmd/test2json).
type event struct {
	Action      string
	Package     string
	Test        string
	Output      string
	Elapsed     float64
	ImportPath  string
	FailedBuild string
}

type testResult struct {
	output []string
	action string
}

type pkgResult struct {
	name    string
	tests   map[string]*testResult
	order   []string
	output  []string // package-level output (build errors, panics outside tests)
	action  string
	elapsed float64
}

func main() {
	verbose := flag.Bool("v", false, "also pass every output line through as it arrives (as go test -v)")
	strict := flag.Bool("strict", os.Getenv("CI") == "true", "fail on skipped tests not in -allow (default: CI=true)")
	allowPath := flag.String("allow", "hack/ci-allowed-skips.txt", "file of `package-suffix TestName reason` lines: skips allowed with -strict")
	flag.Parse()
	allow, err := readAllow(*allowPath)
	if err != nil && *strict {
		fmt.Fprintln(os.Stderr, "testsummary:", err)
		os.Exit(2)
	}
	ok, err := summarize(os.Stdin, os.Stdout, *verbose, *strict, allow)
	if err != nil {
		fmt.Fprintln(os.Stderr, "testsummary:", err)
		os.Exit(2)
	}
	if !ok {
		os.Exit(1)
	}
}

// allowed maps a package suffix to the test names that may skip in CI.
type allowed map[string][]string

func readAllow(path string) (allowed, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	out := allowed{}
	for i, line := range strings.Split(string(b), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		f := strings.Fields(line)
		if len(f) < 3 {
			return nil, fmt.Errorf("%s:%d: want `package-suffix TestName reason`, got %q", path, i+1, line)
		}
		out[f[0]] = append(out[f[0]], f[1])
	}
	return out, nil
}

// allows reports whether test (or the top-level test it belongs to) of pkg may skip.
func (a allowed) allows(pkg, test string) bool {
	top, _, _ := strings.Cut(test, "/")
	for suffix, tests := range a {
		if (pkg == suffix || strings.HasSuffix(pkg, "/"+suffix)) && slices.Contains(tests, top) {
			return true
		}
	}
	return false
}

// summarize reads the events of in and writes the report to out; verbose also
// copies each output line as it arrives. It returns false when anything failed.
func summarize(in io.Reader, out io.Writer, verbose, strict bool, allow allowed) (bool, error) {
	pkgs := map[string]*pkgResult{}
	var order []string
	get := func(name string) *pkgResult {
		p := pkgs[name]
		if p == nil {
			p = &pkgResult{name: name, tests: map[string]*testResult{}}
			pkgs[name] = p
			order = append(order, name)
		}
		return p
	}
	ok := true
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		line := sc.Bytes()
		var e event
		if err := json.Unmarshal(line, &e); err != nil || (e.Action == "" && e.ImportPath == "") {
			_, _ = fmt.Fprintln(out, string(line)) // not an event: go vet or build chatter
			continue
		}
		if verbose && e.Output != "" {
			_, _ = fmt.Fprint(out, e.Output)
		}
		switch {
		case e.Action == "build-output":
			get(e.ImportPath).output = append(get(e.ImportPath).output, e.Output)
			continue
		case e.Action == "build-fail":
			p := get(e.ImportPath)
			p.action = "fail"
			continue
		case e.Package == "":
			continue
		}
		p := get(e.Package)
		if e.Test == "" {
			switch e.Action {
			case "output":
				p.output = append(p.output, e.Output)
			case "pass", "fail", "skip":
				p.action, p.elapsed = e.Action, e.Elapsed
				if p.action == "fail" && e.FailedBuild != "" {
					p.output = append(p.output, fmt.Sprintf("(build of %s failed)\n", e.FailedBuild))
				}
				if !report(out, p, strict, allow) {
					ok = false
				}
			}
			continue
		}
		t := p.tests[e.Test]
		if t == nil {
			t = &testResult{}
			p.tests[e.Test] = t
			p.order = append(p.order, e.Test)
		}
		switch e.Action {
		case "output":
			t.output = append(t.output, e.Output)
		case "pass", "fail", "skip":
			t.action = e.Action
		}
	}
	if err := sc.Err(); err != nil {
		return false, err
	}
	// Packages that never finished (the test binary was killed, e.g. by -timeout).
	for _, name := range order {
		if p := pkgs[name]; p.action == "" {
			p.action = "fail"
			p.output = append(p.output, "(no result: the test binary did not finish)\n")
			report(out, p, strict, allow)
			ok = false
		}
	}
	return ok, nil
}

// report prints a package's line and what explains a failure; it returns false
// when the package failed (or, with strict, skipped a test it may not).
func report(out io.Writer, p *pkgResult, strict bool, allow allowed) bool {
	if p.action == "skip" && len(p.order) == 0 {
		return true // no test files
	}
	var run, passed, failed, skipped int
	var badSkips, failures []string
	for _, name := range p.order {
		t := p.tests[name]
		switch t.action {
		case "pass":
			run++
			passed++
		case "fail":
			run++
			failed++
			_, _ = fmt.Fprintf(out, "--- FAIL %s %s\n%s", p.name, name, strings.Join(t.output, ""))
			failures = append(failures, name)
		case "skip":
			skipped++
			if strict && !allow.allows(p.name, name) {
				badSkips = append(badSkips, fmt.Sprintf("%s: %s", name, skipReason(t.output)))
			}
		}
	}
	for _, name := range failures {
		_, _ = fmt.Fprintf(out, "--- WHY %s %s: its last messages (full output above)\n", p.name, name)
		for _, m := range lastMessages(p.tests[name].output, whyMessages) {
			_, _ = fmt.Fprintf(out, "    %s\n", m)
		}
	}
	good := p.action != "fail" && len(badSkips) == 0
	if p.action == "fail" {
		// A test still running when the binary died (a panic, log.Fatal,
		// os.Exit, the timeout) has no result: its output holds why.
		for _, name := range p.order {
			if t := p.tests[name]; t.action == "" {
				_, _ = fmt.Fprintf(out, "--- DIED %s %s (no result: the test binary ended while it ran); its last output:\n%s",
					p.name, name, lastLines(t.output, diedLines))
			}
		}
	}
	if p.action == "fail" && failed == 0 {
		_, _ = fmt.Fprintf(out, "--- FAIL %s\n%s", p.name, strings.Join(p.output, ""))
	}
	for _, s := range badSkips {
		_, _ = fmt.Fprintf(out, "--- SKIPPED IN CI (fails with CI=true; fix the prerequisite or list it in hack/ci-allowed-skips.txt) %s %s\n", p.name, s)
	}
	status := "ok  "
	if !good {
		status = "FAIL"
	}
	_, _ = fmt.Fprintf(out, "%s %-55s %4d run, %4d passed, %3d failed, %3d skipped  (%s)\n",
		status, p.name, run, passed, failed, skipped, time.Duration(p.elapsed*float64(time.Second)).Round(10*time.Millisecond))
	return good
}

// skipReason picks the t.Skip message out of a skipped test's output.
func skipReason(output []string) string {
	for _, l := range output {
		l = strings.TrimSpace(l)
		if l == "" || strings.HasPrefix(l, "=== ") || strings.HasPrefix(l, "--- SKIP") {
			continue
		}
		return l
	}
	return "(no message)"
}

// diedLines is how many of a died test's last output lines the summary shows.
const diedLines = 60

// lastLines returns the last n lines of output.
func lastLines(output []string, n int) string {
	lines := strings.SplitAfter(strings.Join(output, ""), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "")
}

// whyMessages is how many of a failed test's last messages the summary repeats.
const whyMessages = 12

// messageHead matches the first line of a t.Log/t.Error/t.Fatal message in
// go test -v output ("    file_test.go:12: text"); continuation lines are
// indented deeper and carry no file:line.
var messageHead = regexp.MustCompile(`^\s+[\w.-]+\.go:\d+: `)

// lastMessages returns the first lines of the last n messages in output,
// each cut to 300 bytes.
func lastMessages(output []string, n int) []string {
	var heads []string
	for _, chunk := range output {
		for _, l := range strings.Split(strings.TrimRight(chunk, "\n"), "\n") {
			if messageHead.MatchString(l) {
				l = strings.TrimSpace(l)
				if len(l) > 300 {
					l = l[:300] + "..."
				}
				heads = append(heads, l)
			}
		}
	}
	return heads[max(0, len(heads)-n):]
}
