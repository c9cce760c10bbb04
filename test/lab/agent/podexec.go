package agent

import (
	"cmp"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// Bind is one bind mount a container gets: Src on the host at Dst.
type Bind struct {
	Src, Dst string
	ReadOnly bool
}

func (b Bind) String() string {
	s := b.Src + ":" + b.Dst
	if b.ReadOnly {
		s += ":ro"
	}
	return s
}

// ParseBind parses SRC:DST[:ro].
func ParseBind(s string) (Bind, error) {
	parts := strings.Split(s, ":")
	switch {
	case len(parts) == 2:
		return Bind{Src: parts[0], Dst: parts[1]}, nil
	case len(parts) == 3 && (parts[2] == "ro" || parts[2] == "rw"):
		return Bind{Src: parts[0], Dst: parts[1], ReadOnly: parts[2] == "ro"}, nil
	}
	return Bind{}, fmt.Errorf("bind %q: want SRC:DST[:ro]", s)
}

// Cred is the user a container's process runs as.
type Cred struct {
	UID, GID int64
	// Groups are the supplementary groups (fsGroup, supplementalGroups).
	Groups []int64
}

func (c *Cred) String() string {
	if c == nil {
		return "root"
	}
	s := fmt.Sprintf("%d:%d", c.UID, c.GID)
	if len(c.Groups) > 0 {
		groups := make([]string, len(c.Groups))
		for i, g := range c.Groups {
			groups[i] = strconv.FormatInt(g, 10)
		}
		s += ":" + strings.Join(groups, ",")
	}
	return s
}

// ParseCred parses UID:GID[:GROUP,...].
func ParseCred(s string) (Cred, error) {
	bad := fmt.Errorf("user %q: want UID:GID[:GROUP,...]", s)
	parts := strings.SplitN(s, ":", 3)
	if len(parts) < 2 {
		return Cred{}, bad
	}
	var ids []int64
	if len(parts) == 3 {
		parts = append(parts[:2], strings.Split(parts[2], ",")...)
	}
	for _, p := range parts {
		id, err := strconv.ParseUint(p, 10, 32)
		if err != nil {
			return Cred{}, bad
		}
		ids = append(ids, int64(id))
	}
	c := Cred{UID: ids[0], GID: ids[1]}
	if len(ids) > 2 {
		c.Groups = ids[2:]
	}
	return c, nil
}

// PodExec says how pod-exec prepares a container's process.
type PodExec struct {
	Binds []Bind
	// Hostname, when set, is set in the (then private) UTS namespace.
	Hostname string
	Workdir  string
	// User, when set, is switched to after the mounts (root keeps every capability,
	// any other user has none).
	User *Cred
}

// PodExecArgs builds the argument list of the pod-exec subcommand.
func PodExecArgs(pe PodExec, prog string, args []string) []string {
	out := []string{"pod-exec"}
	if pe.Hostname != "" {
		out = append(out, "--hostname", pe.Hostname)
	}
	for _, b := range pe.Binds {
		out = append(out, "--bind", b.String())
	}
	if pe.Workdir != "" {
		out = append(out, "--workdir", pe.Workdir)
	}
	if pe.User != nil {
		out = append(out, "--user", pe.User.String())
	}
	out = append(out, "--", prog)
	return append(out, args...)
}

// PodExecMain is the pod-exec subcommand (args after "pod-exec"). It runs in
// a private mount namespace (the agent starts it through `ip netns exec` or
// with CLONE_NEWNS), bind-mounts the container's volumes and replaces itself
// with the container's program, which keeps the pid the agent waits for.
func PodExecMain(args []string) error {
	var binds []Bind
	var workdir, hostname string
	var user *Cred
	i := 0
	for ; i < len(args); i++ {
		switch args[i] {
		case "--bind":
			if i+1 >= len(args) {
				return errors.New("pod-exec: --bind needs a value")
			}
			b, err := ParseBind(args[i+1])
			if err != nil {
				return fmt.Errorf("pod-exec: %w", err)
			}
			binds = append(binds, b)
			i++
		case "--hostname":
			if i+1 >= len(args) {
				return errors.New("pod-exec: --hostname needs a value")
			}
			hostname = args[i+1]
			i++
		case "--user":
			if i+1 >= len(args) {
				return errors.New("pod-exec: --user needs a value")
			}
			c, err := ParseCred(args[i+1])
			if err != nil {
				return fmt.Errorf("pod-exec: %w", err)
			}
			user = &c
			i++
		case "--workdir":
			if i+1 >= len(args) {
				return errors.New("pod-exec: --workdir needs a value")
			}
			workdir = args[i+1]
			i++
		case "--":
			i++
			goto done
		default:
			return fmt.Errorf("pod-exec: unknown argument %q", args[i])
		}
	}
done:
	if i >= len(args) {
		return errors.New("pod-exec: no program after --")
	}
	prog, argv := args[i], args[i:]
	// Never let our mounts propagate back to the host's mount namespace.
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_SLAVE, ""); err != nil {
		return fmt.Errorf("pod-exec: making / a slave mount: %w", err)
	}
	if hostname != "" {
		if err := unix.Sethostname([]byte(hostname)); err != nil {
			return fmt.Errorf("pod-exec: setting the host name: %w", err)
		}
	}
	if err := mountAll(binds); err != nil {
		return err
	}
	if workdir != "" {
		if err := os.MkdirAll(workdir, 0o755); err != nil {
			return fmt.Errorf("pod-exec: workingDir: %w", err)
		}
		if err := os.Chdir(workdir); err != nil {
			return fmt.Errorf("pod-exec: workingDir: %w", err)
		}
	}
	if !strings.Contains(prog, "/") {
		p, err := exec.LookPath(prog)
		if err != nil {
			return fmt.Errorf("pod-exec: %w", err)
		}
		prog = p
	}
	if user != nil {
		if err := switchUser(*user); err != nil {
			return err
		}
	}
	if err := syscall.Exec(prog, argv, os.Environ()); err != nil {
		return fmt.Errorf("pod-exec: exec %s: %w", prog, err)
	}
	return nil
}

// switchUser sets groups, gid and uid (for every thread); leaving root clears the
// capabilities, as for a container whose user is not root.
func switchUser(c Cred) error {
	groups := make([]int, len(c.Groups))
	for i, g := range c.Groups {
		groups[i] = int(g)
	}
	if err := syscall.Setgroups(groups); err != nil {
		return fmt.Errorf("pod-exec: setting the groups %v: %w", c.Groups, err)
	}
	if err := syscall.Setgid(int(c.GID)); err != nil {
		return fmt.Errorf("pod-exec: setting the gid %d: %w", c.GID, err)
	}
	if err := syscall.Setuid(int(c.UID)); err != nil {
		return fmt.Errorf("pod-exec: setting the uid %d: %w", c.UID, err)
	}
	return nil
}

// mountAll bind-mounts binds as a container runtime does: parents before the mounts nested
// in them (by path depth, the order runc sorts mounts in), and read-only only once every
// mount is in place, so a mount nested in a read-only one (MetalLB's speaker mounts
// /etc/metallb/memberlist inside /etc/metallb, both read-only) gets its mount point
// created in the parent volume's directory instead of failing on a read-only file system.
func mountAll(binds []Bind) error {
	binds = slices.Clone(binds)
	slices.SortStableFunc(binds, func(a, b Bind) int { return cmp.Compare(pathDepth(a.Dst), pathDepth(b.Dst)) })
	for _, b := range binds {
		if err := bindMount(b); err != nil {
			return err
		}
	}
	for _, b := range binds {
		if !b.ReadOnly {
			continue
		}
		if err := unix.Mount("", b.Dst, "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_RDONLY, ""); err != nil {
			return fmt.Errorf("pod-exec: read-only remount of %s: %w", b.Dst, err)
		}
	}
	return nil
}

// pathDepth is the number of elements of a clean path ("/" is 0, "/etc/metallb" 2).
func pathDepth(p string) int {
	p = filepath.Clean(p)
	if p == "/" {
		return 0
	}
	return strings.Count(p, "/")
}

// bindMount bind-mounts b (read-write: mountAll makes it read-only afterwards).
func bindMount(b Bind) error {
	st, err := os.Stat(b.Src)
	if err != nil {
		return fmt.Errorf("pod-exec: bind source: %w", err)
	}
	// The mount point must exist; it is created on the shared file system
	// (an empty directory or file), the mount itself stays private.
	if st.IsDir() {
		if err := os.MkdirAll(b.Dst, 0o755); err != nil {
			return fmt.Errorf("pod-exec: mount point %s: %w", b.Dst, err)
		}
	} else {
		if err := os.MkdirAll(filepath.Dir(b.Dst), 0o755); err != nil {
			return fmt.Errorf("pod-exec: mount point %s: %w", b.Dst, err)
		}
		if _, err := os.Stat(b.Dst); errors.Is(err, os.ErrNotExist) {
			f, err := os.OpenFile(b.Dst, os.O_CREATE|os.O_WRONLY, 0o644)
			if err != nil {
				return fmt.Errorf("pod-exec: mount point %s: %w", b.Dst, err)
			}
			if err := f.Close(); err != nil {
				return fmt.Errorf("pod-exec: mount point %s: %w", b.Dst, err)
			}
		}
	}
	if err := unix.Mount(b.Src, b.Dst, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		return fmt.Errorf("pod-exec: bind %s at %s: %w", b.Src, b.Dst, err)
	}
	return nil
}
