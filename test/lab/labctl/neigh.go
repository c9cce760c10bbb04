package labctl

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/ironlb/ironlb/test/lab/labnet"
)

// The kernel's ARP and NDP neighbour tables are shared by every network namespace, and
// their gc_thresh3 (1024 by default, settable in the root namespace only) caps the entries
// of all namespaces together. A lab client that talks to thousands of Service IPs (the scale
// benchmarks: a /16 service CIDR, 2,000 Services) overflows it, and then the kernel fails
// neighbour resolutions at random in every namespace, the root's included ("neighbour:
// arp_cache: neighbor table overflow!"), which reads as Services that stop answering.
// A lab with such a service CIDR raises the limits for its lifetime: up records the values it
// changed in .lab, and down puts them back.

// neighLimitsFile records the root namespace's neighbour limits a lab raised.
const neighLimitsFile = "neigh-limits.json"

// neighSysctls are the limits raised: gc_thresh3 (hard cap) and gc_thresh2 (above which
// entries are collected within 5 s), for ARP and NDP.
var neighSysctls = []string{
	"net.ipv4.neigh.default.gc_thresh2", "net.ipv4.neigh.default.gc_thresh3",
	"net.ipv6.neigh.default.gc_thresh2", "net.ipv6.neigh.default.gc_thresh3",
}

// neighLimitsFor is the gc_thresh3 a lab whose Services are allocated from subnet needs (0:
// the default suffices): room for an entry per Service IP, up to 65,536, twice over (a
// client's and the nodes' entries), plus the kernel's default.
func neighLimitsFor(subnet netip.Prefix) int {
	bits := subnet.Addr().BitLen() - subnet.Bits()
	if bits <= 10 { // 1,024 addresses or fewer: the default cap holds
		return 0
	}
	return 2<<min(bits, 16) + 1024
}

// raiseNeighbourLimits raises the root namespace's neighbour limits to fit subnet, recording
// the previous values; a limit already high enough is left alone.
func (l *Lab) raiseNeighbourLimits(subnet netip.Prefix) error {
	want := neighLimitsFor(subnet)
	if want == 0 {
		return nil
	}
	saved := map[string]int{}
	for _, key := range neighSysctls {
		cur, err := readSysctlInt(key)
		if err != nil {
			return err
		}
		target := want
		if strings.HasSuffix(key, "gc_thresh2") {
			target = want / 2
		}
		if cur >= target {
			continue
		}
		if err := writeSysctl(key, target); err != nil {
			return err
		}
		saved[key] = cur
		l.printf("    %s: %d -> %d (the neighbour tables are shared by every namespace; restored by lab down)\n", key, cur, target)
	}
	if len(saved) == 0 {
		return nil
	}
	b, err := json.Marshal(saved)
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(l.StateDir(), neighLimitsFile), b, 0o644)
}

// restoreNeighbourLimits puts back the limits raiseNeighbourLimits recorded.
func (l *Lab) restoreNeighbourLimits() error {
	path := filepath.Join(l.StateDir(), neighLimitsFile)
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	} else if err != nil {
		return err
	}
	var saved map[string]int
	if err := json.Unmarshal(b, &saved); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	var errs []error
	for key, v := range saved {
		errs = append(errs, writeSysctl(key, v))
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	return os.Remove(path)
}

func readSysctlInt(key string) (int, error) {
	b, err := os.ReadFile(labnet.SysctlPath(key))
	if err != nil {
		return 0, fmt.Errorf("reading sysctl %s: %w", key, err)
	}
	v, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return 0, fmt.Errorf("sysctl %s: %w", key, err)
	}
	return v, nil
}

func writeSysctl(key string, v int) error {
	if err := os.WriteFile(labnet.SysctlPath(key), []byte(strconv.Itoa(v)), 0o644); err != nil {
		return fmt.Errorf("setting sysctl %s=%d: %w", key, v, err)
	}
	return nil
}
