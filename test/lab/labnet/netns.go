package labnet

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// NetnsDir is where iproute2 keeps named network namespaces.
const NetnsDir = "/run/netns"

// IP runs `ip ARGS...` and returns its output; the error names the command and its stderr.
func IP(ctx context.Context, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, "ip", args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String(), fmt.Errorf("ip %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return stdout.String(), nil
}

// ListNS returns the names of all named network namespaces, sorted.
func ListNS(ctx context.Context) ([]string, error) {
	out, err := IP(ctx, "netns", "list")
	if err != nil {
		return nil, err
	}
	var names []string
	for _, line := range strings.Split(out, "\n") {
		if f := strings.Fields(line); len(f) > 0 {
			names = append(names, f[0])
		}
	}
	sort.Strings(names)
	return names, nil
}

// LabNamespaces returns the lab's existing host namespaces (see IsLabNS; pod namespaces are
// not included).
func LabNamespaces(ctx context.Context) ([]string, error) {
	all, err := ListNS(ctx)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, n := range all {
		if IsLabNS(n) {
			out = append(out, n)
		}
	}
	return out, nil
}

// NSExists reports whether a named namespace exists.
func NSExists(name string) bool {
	_, err := os.Stat(filepath.Join(NetnsDir, name))
	return err == nil
}

// NSPids returns the processes whose network namespace is the named one.
func NSPids(ctx context.Context, name string) ([]int, error) {
	out, err := IP(ctx, "netns", "pids", name)
	if err != nil {
		return nil, err
	}
	var pids []int
	for _, f := range strings.Fields(out) {
		if pid, err := strconv.Atoi(f); err == nil {
			pids = append(pids, pid)
		}
	}
	return pids, nil
}

// InNS runs fn on an OS thread switched into the named network namespace. Sockets fn creates
// stay in that namespace after it returns. If the thread cannot be switched back, it is left
// locked so the Go runtime discards it instead of reusing a thread in the wrong namespace.
func InNS(name string, fn func() error) error {
	target, err := os.Open(filepath.Join(NetnsDir, name))
	if err != nil {
		return fmt.Errorf("opening network namespace %q: %w", name, err)
	}
	defer func() { _ = target.Close() }()
	runtime.LockOSThread()
	orig, err := os.Open("/proc/thread-self/ns/net")
	if err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("opening the current network namespace: %w", err)
	}
	defer func() { _ = orig.Close() }()
	if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("entering network namespace %q: %w", name, err)
	}
	fnErr := fn()
	if err := unix.Setns(int(orig.Fd()), unix.CLONE_NEWNET); err != nil {
		// Keep the thread locked: it exits with the goroutine.
		return errors.Join(fnErr, fmt.Errorf("returning from network namespace %q: %w", name, err))
	}
	runtime.UnlockOSThread()
	return fnErr
}

// SysctlPath is the /proc/sys file of a sysctl key (dotted or slashed, e.g.
// "net.ipv4.ip_forward"), in the namespace of the thread that opens it.
func SysctlPath(key string) string {
	return filepath.Join("/proc/sys", strings.ReplaceAll(key, ".", "/"))
}

// Sysctl sets a sysctl (dotted or slashed key, e.g. "net.ipv4.ip_forward") inside a namespace.
func Sysctl(ns, key, value string) error {
	path := SysctlPath(key)
	return InNS(ns, func() error {
		if err := os.WriteFile(path, []byte(value), 0o644); err != nil {
			return fmt.Errorf("setting sysctl %s=%s in %s: %w", key, value, ns, err)
		}
		return nil
	})
}
