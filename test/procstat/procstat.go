// Package procstat reads /proc/PID/stat (proc(5)) for the lab and the
// benchmarks: a process's command name, state, parent, CPU time and start
// time. The command name is in parentheses and may itself hold spaces and
// parentheses, so the other fields are counted from the last ")".
package procstat

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// ClockTick is USER_HZ, the unit of the CPU and start times: 100 on Linux.
const ClockTick = time.Second / 100

// Stat is the part of /proc/PID/stat the project reads.
type Stat struct {
	Comm  string // field 2: the command name, without its parentheses
	State string // field 3: R, S, D, Z, X, ...
	PPID  int    // field 4
	// Fields 14-17, in clock ticks: user and system time of the process and
	// of the children it has waited for.
	UTime, STime, CUTime, CSTime uint64
	// StartTime (field 22) is when the process started, in clock ticks since
	// boot: with the pid, it tells a process from a later one that reused
	// its pid.
	StartTime uint64
}

// CPU is the user and system time the process itself used.
func (s Stat) CPU() time.Duration { return time.Duration(s.UTime+s.STime) * ClockTick }

// ErrMalformed wraps every parse failure.
var ErrMalformed = errors.New("malformed /proc/PID/stat")

// Parse parses the content of a /proc/PID/stat file.
func Parse(b []byte) (Stat, error) {
	s := string(b)
	open, closing := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
	if open < 0 || closing < open {
		return Stat{}, fmt.Errorf("%w: no parenthesised command name", ErrMalformed)
	}
	f := strings.Fields(s[closing+1:]) // f[0] is field 3
	if len(f) < 20 {
		return Stat{}, fmt.Errorf("%w: %d fields after the command name, want at least 20", ErrMalformed, len(f))
	}
	st := Stat{Comm: s[open+1 : closing], State: f[0]}
	var err error
	num := func(i int) uint64 {
		n, e := strconv.ParseUint(f[i], 10, 64)
		if e != nil && err == nil {
			err = fmt.Errorf("%w: field %d: %q is not a number", ErrMalformed, i+3, f[i])
		}
		return n
	}
	st.PPID = int(num(1))
	st.UTime, st.STime, st.CUTime, st.CSTime = num(11), num(12), num(13), num(14)
	st.StartTime = num(19)
	if err != nil {
		return Stat{}, err
	}
	return st, nil
}

// Read reads and parses /proc/PID/stat. A process that is gone gives an error
// wrapping fs.ErrNotExist.
func Read(pid int) (Stat, error) {
	return ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
}

// ReadFile reads and parses a stat file by path (/proc/PID/stat, or a
// task's /proc/PID/task/TID/stat).
func ReadFile(path string) (Stat, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return Stat{}, err
	}
	st, err := Parse(b)
	if err != nil {
		return Stat{}, fmt.Errorf("%s: %w", path, err)
	}
	return st, nil
}
