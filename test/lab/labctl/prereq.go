package labctl

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
)

// aptPrograms maps each program the lab (or a test on a lab host) needs to its Debian package.
var aptPrograms = map[string]string{
	"ip":        "iproute2",
	"nsenter":   "util-linux",
	"iptables":  "iptables",
	"conntrack": "conntrack",
	"curl":      "curl",
	"arping":    "arping",
	"ndisc6":    "ndisc6",
	"tcpdump":   "tcpdump",
	"nft":       "nftables",
}

// KubeBinaries are built by `make tools` from the pinned Kubernetes module.
var KubeBinaries = []string{"etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kube-proxy", "kubectl"}

// EnsurePrerequisites installs the missing apt packages (running `apt-get update` first only
// when something is missing).
func (l *Lab) EnsurePrerequisites(ctx context.Context) error {
	if os.Geteuid() != 0 {
		return errors.New("the lab needs root (network namespaces, veths, iptables): run it with sudo or as root")
	}
	var missing []string
	for prog, pkg := range aptPrograms {
		if _, err := exec.LookPath(prog); err != nil {
			missing = append(missing, pkg)
		}
	}
	if len(missing) == 0 {
		return nil
	}
	sort.Strings(missing)
	done := l.step("installing missing packages: %s", strings.Join(missing, " "))
	if _, err := exec.LookPath("apt-get"); err != nil {
		return fmt.Errorf("packages %s are missing and there is no apt-get: install them with your package manager", strings.Join(missing, " "))
	}
	for _, args := range [][]string{
		{"apt-get", "update", "-qq"},
		append([]string{"apt-get", "install", "-y", "-qq", "--no-install-recommends"}, missing...),
	} {
		cmd := exec.CommandContext(ctx, args[0], args[1:]...)
		cmd.Env = append(os.Environ(), "DEBIAN_FRONTEND=noninteractive")
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("%s: %w\n%s\nInstall the packages by hand, then run the lab again", strings.Join(args, " "), err, tail(string(out), 20))
		}
	}
	done()
	return nil
}

// CheckKubeBinaries reports which Kubernetes binaries are missing from bin/.
func (l *Lab) CheckKubeBinaries() error {
	var missing []string
	for _, b := range KubeBinaries {
		if st, err := os.Stat(l.bin(b)); err != nil || st.Mode()&0o111 == 0 {
			missing = append(missing, b)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("missing in %s: %s; build them with `make tools` (Kubernetes from the Go module proxy, ~10-15 min cold on 2 cores)", l.BinDir(), strings.Join(missing, ", "))
	}
	return nil
}

// labPrograms are the repository's programs the lab runs: package path -> binary name.
// ironlb itself runs from its image (BuildImage).
var labPrograms = []struct{ pkg, name string }{
	{"./test/lab/cmd/lab-agent", "lab-agent"},
	{"./test/lab/cmd/lab-whoami", "lab-whoami"},
}

// BuildPrograms builds bin/lab-agent and bin/lab-whoami from this checkout, then ironlb's
// image (BuildImage). With onlyPresent, packages missing from the checkout are skipped
// instead of failing.
func (l *Lab) BuildPrograms(ctx context.Context, onlyPresent bool) error {
	// The Makefile's GO_BUILD flags: one build cache with the image's binary.
	args := []string{"build", "-trimpath", "-buildvcs=false", "-o", l.BinDir() + "/"}
	var names []string
	for _, p := range labPrograms {
		if _, err := os.Stat(filepath.Join(l.Root, p.pkg)); err != nil {
			if onlyPresent {
				continue
			}
			return fmt.Errorf("package %s is not in this checkout (%w); the node agent and whoami live on branch `agent` until it is merged", p.pkg, err)
		}
		args = append(args, p.pkg)
		names = append(names, "bin/"+p.name)
	}
	if err := os.MkdirAll(l.BinDir(), 0o755); err != nil {
		return err
	}
	done := l.step("building %s", strings.Join(names, ", "))
	cmd := exec.CommandContext(ctx, "go", args...)
	cmd.Dir = l.Root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go %s: %w\n%s", strings.Join(args, " "), err, tail(string(out), 40))
	}
	done()
	return l.BuildImage(ctx)
}

// ImageLayout is the OCI image layout `make image` writes and the node agents run
// ironlb's pods from.
func (l *Lab) ImageLayout() string { return filepath.Join(l.BinDir(), "image", "oci") }

// BuildImage runs `make image` for this machine's architecture (the lab's nodes are
// this machine; PLATFORMS in the environment overrides it), into ImageLayout.
// Incremental (the Go build cache); an unchanged tree gives the same digest and leaves
// the layout as it is, so `make demo`, which builds the same image first, is not repeated.
func (l *Lab) BuildImage(ctx context.Context) error {
	platforms := os.Getenv("PLATFORMS")
	if platforms == "" {
		platforms = "linux/" + runtime.GOARCH
	}
	done := l.step("building ironlb's image (make image PLATFORMS=" + platforms + "; the first build compiles every dependency: minutes)")
	cmd := exec.CommandContext(ctx, "make", "--no-print-directory", "image", "PLATFORMS="+platforms)
	cmd.Dir = l.Root
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("make image: %w\n%s", err, tail(string(out), 40))
	}
	done()
	// The build's summary: reference@digest, then each platform's digest.
	for _, line := range strings.Split(string(out), "\n") {
		if strings.Contains(line, "sha256:") {
			l.printf("    %s\n", strings.TrimSpace(line))
		}
	}
	return nil
}

// tail returns the last n lines of s.
func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
