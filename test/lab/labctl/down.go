package labctl

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"golang.org/x/sys/unix"
	"k8s.io/apimachinery/pkg/types"

	"github.com/ironlb/ironlb/test/lab/agent"
	"github.com/ironlb/ironlb/test/lab/labnet"
)

// DownOptions configure Lab.Down.
type DownOptions struct {
	// KeepLogs keeps .lab/logs (everything else under .lab is removed).
	KeepLogs bool
	// Quiet prints nothing unless something fails.
	Quiet bool
	// Force removes the lab even when another checkout's lab owns it (see Owner).
	Force bool
}

// Down removes the lab: it kills every process in the lab's namespaces, the processes recorded
// in pid files and their descendants, deletes the lab's namespaces and any lab link left in the
// root namespace, and removes .lab. It works on a half-built or crashed lab too, and touches
// nothing that is not the lab's (names and pids are checked, see labnet.IsLabNS).
func (l *Lab) Down(ctx context.Context, opts DownOptions) error {
	report := func(format string, args ...any) {
		if !opts.Quiet {
			l.printf(format, args...)
		}
	}
	if other := l.otherOwner(ctx); other != "" && !opts.Force {
		return errOtherOwner(other, "not removing it from here")
	}
	nss, err := labnet.LabNamespaces(ctx)
	if err != nil {
		return err
	}
	nss = append(l.PodNamespaces(ctx), nss...)

	// Processes: pid files first (a process keeps its namespace alive even once the name is
	// gone), then everything inside a lab namespace, then all their descendants (pod
	// processes the agent started).
	var roots []int
	procs, _ := l.Procs()
	for _, p := range procs {
		if p.Alive {
			roots = append(roots, p.Pid)
		}
	}
	for _, ns := range nss {
		pids, err := labnet.NSPids(ctx, ns)
		if err != nil {
			report("warning: listing processes in %s: %v\n", ns, err)
		}
		roots = append(roots, pids...)
	}
	roots = uniq(roots)
	all := uniq(append(append([]int(nil), roots...), descendants(roots)...))
	self := os.Getpid()
	var victims []int
	for _, p := range all {
		if p != self && p > 1 {
			victims = append(victims, p)
		}
	}
	if len(victims) > 0 {
		report("killing %d processes\n", len(victims))
		if left := killAll(victims); len(left) > 0 {
			report("warning: processes still alive after SIGKILL: %v\n", left)
		}
	}

	// Namespaces: pods first, then hosts, the switch last.
	sort.SliceStable(nss, func(i, j int) bool { return nsOrder(nss[i]) < nsOrder(nss[j]) })
	var failed []string
	for _, ns := range nss {
		if _, err := labnet.IP(ctx, "netns", "del", ns); err != nil {
			failed = append(failed, err.Error())
			continue
		}
	}
	if len(nss) > 0 {
		report("deleted namespaces: %s\n", strings.Join(nss, " "))
	}
	links, _ := labnet.RootLinks(ctx)
	for _, link := range links {
		if _, err := labnet.IP(ctx, "link", "del", link); err != nil {
			failed = append(failed, err.Error())
		}
	}
	if len(links) > 0 {
		report("deleted links: %s\n", strings.Join(links, " "))
	}

	// mypc's resolver (lab up --dns): read before .lab goes, which records whether
	// the lab created /etc/netns.
	confs, err := l.removeResolvConfs()
	if err != nil {
		failed = append(failed, err.Error())
	}
	if len(confs) > 0 {
		report("removed %s\n", strings.Join(confs, " "))
	}

	if err := l.restoreNeighbourLimits(); err != nil {
		failed = append(failed, err.Error())
	}
	l.releaseOwner(opts.Force)
	removed, err := l.removeState(opts.KeepLogs)
	if err != nil {
		failed = append(failed, err.Error())
	}
	if removed {
		if opts.KeepLogs {
			report("removed %s (kept logs)\n", l.StateDir())
		} else {
			report("removed %s\n", l.StateDir())
		}
	}
	if len(failed) > 0 {
		return fmt.Errorf("lab down left things behind:\n  %s", strings.Join(failed, "\n  "))
	}
	if len(victims) == 0 && len(nss) == 0 && len(links) == 0 && len(confs) == 0 && !removed {
		report("no lab found: nothing to remove\n")
	}
	return nil
}

// PodNamespaces returns the existing pod namespaces of this lab: those whose veth is in one of
// its node namespaces, and those its agents' state records (pods/<uid>), which still finds
// them when a node namespace is already gone. Pod namespaces of agents outside the lab (their
// own tests) are never included, although they are named alike.
func (l *Lab) PodNamespaces(ctx context.Context) []string {
	set := map[string]bool{}
	hosts, _ := labnet.LabNamespaces(ctx)
	for _, ns := range hosts {
		veths, _ := labnet.Links(ctx, ns, func(n string) bool { return labnet.PodNSOfVeth(n) != "" })
		for _, v := range veths {
			set[labnet.PodNSOfVeth(v)] = true
		}
	}
	dirs, _ := filepath.Glob(filepath.Join(l.StateDir(), "node-*", "pods", "*"))
	for _, d := range dirs {
		ns, _ := agent.PodNetNames(types.UID(filepath.Base(d)))
		set[ns] = true
	}
	var out []string
	for ns := range set {
		if labnet.IsPodNS(ns) && labnet.NSExists(ns) {
			out = append(out, ns)
		}
	}
	sort.Strings(out)
	return out
}

// nsOrder sorts pod namespaces before host namespaces before the switch.
func nsOrder(ns string) int {
	switch {
	case strings.HasPrefix(ns, labnet.NSPrefix+"p-"):
		return 0
	case ns == labnet.SwitchNS:
		return 2
	}
	return 1
}

// removeState removes .lab (but logs with keepLogs). Mounts under it (the agent's volume
// mounts, should any survive their processes) are detached first so removal never descends
// into another file system.
func (l *Lab) removeState(keepLogs bool) (bool, error) {
	dir := l.StateDir()
	if _, err := os.Stat(dir); errors.Is(err, os.ErrNotExist) {
		return false, nil
	} else if err != nil {
		return false, err
	}
	if err := unmountUnder(dir); err != nil {
		return false, err
	}
	if !keepLogs {
		return true, os.RemoveAll(dir)
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return false, err
	}
	removed := false
	for _, e := range entries {
		if e.Name() == "logs" {
			continue
		}
		if err := os.RemoveAll(filepath.Join(dir, e.Name())); err != nil {
			return removed, err
		}
		removed = true
	}
	return removed, nil
}

// unmountUnder lazily unmounts every mount point below dir, deepest first.
func unmountUnder(dir string) error {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return err
	}
	defer func() { _ = f.Close() }()
	var points []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 5 {
			continue
		}
		mp := unescapeMount(fields[4])
		if strings.HasPrefix(mp, dir+"/") {
			points = append(points, mp)
		}
	}
	sort.Slice(points, func(i, j int) bool { return len(points[i]) > len(points[j]) })
	for _, mp := range points {
		if err := unix.Unmount(mp, unix.MNT_DETACH); err != nil && err != unix.EINVAL && err != unix.ENOENT {
			return fmt.Errorf("unmounting %s (left by the lab) before removing %s: %w", mp, dir, err)
		}
	}
	return nil
}

// unescapeMount decodes the octal escapes (\040 for space) of /proc/self/mountinfo.
func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			var v int
			if _, err := fmt.Sscanf(s[i+1:i+4], "%o", &v); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

func uniq(in []int) []int {
	seen := map[int]bool{}
	var out []int
	for _, v := range in {
		if !seen[v] {
			seen[v] = true
			out = append(out, v)
		}
	}
	return out
}
