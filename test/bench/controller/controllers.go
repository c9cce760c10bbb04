package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/ironlb/ironlb/test/procstat"
)

// controllerUnderTest is a load balancer controller the benchmark can run against
// its API server.
type controllerUnderTest struct {
	// name labels its figures; key names its files.
	name, key string
	// crdDirs are installed into its API server; its IPAddressPool goes into installNS.
	crdDirs   []string
	installNS string
	// command is the controller's command line against kubeconfig.
	command func(kubeconfig string) *exec.Cmd
	// setup, if set, creates what the controller needs before it starts.
	setup func(ctx context.Context, c client.Client) error
	// pprofAddr serves Go's /debug/pprof.
	pprofAddr string
	// metricsPort serves controller-runtime's metrics over plain HTTP on loopback;
	// 0 when they cannot be read, which skips the client statistics and the restart.
	metricsPort int
}

func ironlb(root, bin string, o options) *controllerUnderTest {
	const ns = "ironlb-system"
	return &controllerUnderTest{
		name: "ironlb", key: "ironlb",
		crdDirs:   []string{filepath.Join(root, "config", "crd", "bases")},
		installNS: ns,
		command: func(kubeconfig string) *exec.Cmd {
			cmd := exec.Command(bin, "controller",
				"--kubeconfig", kubeconfig,
				"--namespace", ns,
				"--webhook-mode", "disabled",
				"--leader-elect=false",
				"--port", strconv.Itoa(o.metricsPort), "--metrics-bind-host", "127.0.0.1", "--metrics-secure=false",
				"--health-probe-port", "0",
				"--pprof-bind-address", fmt.Sprintf("127.0.0.1:%d", o.metricsPort+1),
			)
			cmd.Args = append(cmd.Args, o.controllerArgs...)
			return cmd
		},
		pprofAddr:   fmt.Sprintf("127.0.0.1:%d", o.metricsPort+1),
		metricsPort: o.metricsPort,
	}
}

// metallb is MetalLB's controller as its own manifest runs it (config/manifests/
// metallb-native.yaml: --port=9120 --log-level=info, no leader election), except that
// the webhooks are off (no webhook Service to call back) and so is its metrics
// endpoint, which always requires a service-account token. It reads its own Pod at
// start (the owner of its ConfigurationState), so one is created for it; nothing
// runs it, envtest has no kubelet. Its CRDs come from the module pinned in
// hack/metallb/go.mod.
func metallb(root string, o options) (*controllerUnderTest, error) {
	const ns = "metallb-system"
	bin := filepath.Join(root, "bin", "metallb-controller")
	if _, err := os.Stat(bin); err != nil {
		return nil, fmt.Errorf("needs %s (%w): %w", bin, errNoPeerBinary, err)
	}
	mod := filepath.Join(root, "hack", "metallb")
	out, err := exec.Command("go", "-C", mod, "list", "-m", "-f", "{{.Dir}} {{.Version}}", "go.universe.tf/metallb").Output()
	if err != nil {
		return nil, fmt.Errorf("locating MetalLB's module from %s: %w", mod, err)
	}
	dir, version, ok := strings.Cut(strings.TrimSpace(string(out)), " ")
	if !ok || !regexp.MustCompile(`^v\d+\.\d+\.\d+`).MatchString(version) {
		return nil, fmt.Errorf("unexpected `go list -m go.universe.tf/metallb` output %q", out)
	}
	pprof := fmt.Sprintf("127.0.0.1:%d", o.metricsPort+3)
	const pod = "controller-bench"
	return &controllerUnderTest{
		name: "MetalLB " + version, key: "metallb",
		crdDirs:   []string{filepath.Join(dir, "config", "crd", "bases")},
		installNS: ns,
		command: func(kubeconfig string) *exec.Cmd {
			cmd := exec.Command(bin,
				"--namespace", ns,
				"--webhook-mode", "disabled",
				"--port", "0",
				"--health-probe-port", strconv.Itoa(o.metricsPort+2),
				"--pprof-bind-address", pprof,
				"--log-level", "info",
			)
			cmd.Env = append(os.Environ(), "KUBECONFIG="+kubeconfig, "METALLB_POD_NAME="+pod)
			return cmd
		},
		setup: func(ctx context.Context, c client.Client) error {
			return c.Create(ctx, &corev1.Pod{
				ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: pod, Labels: map[string]string{"app": "metallb", "component": "controller"}},
				Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "controller", Image: "quay.io/metallb/controller:" + version}}},
			})
		},
		pprofAddr: pprof,
	}, nil
}

// proc is a running controller process.
type proc struct {
	cmd  *exec.Cmd
	done chan error
}

// start runs the controller with its output in dir/<key>-<logName>.log.
func (c *controllerUnderTest) start(kubeconfig, dir, logName string) (*proc, error) {
	logf, err := os.Create(filepath.Join(dir, c.key+"-"+logName+".log"))
	if err != nil {
		return nil, err
	}
	cmd := c.command(kubeconfig)
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		_ = logf.Close()
		return nil, fmt.Errorf("starting %s: %w", cmd.Path, err)
	}
	p := &proc{cmd: cmd, done: make(chan error, 1)}
	go func() {
		err := cmd.Wait()
		_ = logf.Close() // the controller's log; it has exited, nothing more to flush
		p.done <- err
	}()
	return p, nil
}

func (p *proc) stop() error {
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-p.done:
		if err != nil {
			fmt.Fprintln(os.Stderr, "controller-bench: controller exit status after SIGTERM:", err)
		}
		return nil
	case <-time.After(60 * time.Second):
		p.kill()
		return errors.New("controller did not stop within 60s of SIGTERM")
	}
}

// exited reports whether the process has ended (and why).
func (p *proc) exited() (bool, error) {
	select {
	case err := <-p.done:
		p.done <- err // for stop
		return true, err
	default:
		return false, nil
	}
}

func (p *proc) kill() {
	if p.cmd.ProcessState == nil {
		_ = p.cmd.Process.Kill()
	}
}

// memory reads the controller's peak resident set size (VmHWM, kB) and its current
// one broken down.
func (p *proc) memory() (hwmKB int64, rss string) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", p.cmd.Process.Pid))
	if err != nil {
		return 0, "?"
	}
	defer func() { _ = f.Close() }()
	s := bufio.NewScanner(f)
	for s.Scan() {
		k, v, _ := strings.Cut(s.Text(), ":")
		switch k {
		case "VmHWM":
			hwmKB, _ = strconv.ParseInt(strings.Fields(v)[0], 10, 64)
		case "VmRSS", "RssAnon", "RssFile":
			if rss != "" {
				rss += ", "
			}
			rss += k + " " + strings.Join(strings.Fields(v), " ")
		}
	}
	return hwmKB, rss
}

// cpu is the user+system CPU time the controller has used.
func (p *proc) cpu() time.Duration { return cpuTime(p.cmd.Process.Pid) }

// cpuTime is the user+system CPU time a process has used.
func cpuTime(pid int) time.Duration {
	if pid <= 0 {
		return 0
	}
	st, err := procstat.Read(pid)
	if err != nil {
		return 0
	}
	return st.CPU()
}

// childPid finds this process's child running the named binary (envtest's servers).
func childPid(name string) int {
	self := os.Getpid()
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if st, err := procstat.Read(pid); err == nil && st.Comm == name && st.PPID == self {
			return pid
		}
	}
	return 0
}
