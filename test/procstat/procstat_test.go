package procstat

import (
	"errors"
	"os"
	"testing"
)

func TestParse(t *testing.T) {
	// A command name with spaces and parentheses; fields 3-22 as in proc(5).
	line := "4242 (kube (proxy) x) S 17 4242 4242 0 -1 4194560 100 0 0 0 250 75 3 4 20 0 12 0 987654 0 0\n"
	st, err := Parse([]byte(line))
	if err != nil {
		t.Fatal(err)
	}
	want := Stat{Comm: "kube (proxy) x", State: "S", PPID: 17, UTime: 250, STime: 75, CUTime: 3, CSTime: 4, StartTime: 987654}
	if st != want {
		t.Errorf("Parse = %+v, want %+v", st, want)
	}
	if got := st.CPU(); got != 3250*1e6 {
		t.Errorf("CPU = %v, want 3.25s", got)
	}
	for _, bad := range []string{"", "4242 kube S 17", "4242 (kube) S 17 1 2", "4242 (kube) S x 4242 4242 0 -1 4194560 100 0 0 0 250 75 3 4 20 0 12 0 987654"} {
		if _, err := Parse([]byte(bad)); !errors.Is(err, ErrMalformed) {
			t.Errorf("Parse(%q) = %v, want ErrMalformed", bad, err)
		}
	}
}

func TestReadSelf(t *testing.T) {
	st, err := Read(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if st.PPID != os.Getppid() || st.StartTime == 0 || st.State == "" {
		t.Errorf("Read(self) = %+v, want ppid %d and a start time", st, os.Getppid())
	}
	if _, err := Read(-1); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("Read(-1) = %v, want ErrNotExist", err)
	}
}

func FuzzParse(f *testing.F) {
	f.Add([]byte("1 (init) S 0 1 1 0 -1 4194560 100 0 0 0 250 75 3 4 20 0 1 0 5 0 0"))
	f.Add([]byte("7 ()) ) R 1 7 7 0 -1 0 0 0 0 0 1 2 3 4 20 0 1 0 9"))
	f.Add([]byte(")("))
	f.Fuzz(func(t *testing.T, b []byte) {
		st, err := Parse(b)
		if err == nil && st.State == "" {
			t.Errorf("Parse(%q) succeeded without a state", b)
		}
	})
}
