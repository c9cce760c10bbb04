package agent

import (
	"errors"
	"fmt"
	"net/http"
	"os"
	"strings"
	"testing"

	"github.com/ironlb/ironlb/test/lab/whoami"
)

// TestMain lets the test binary play the agent's own pod-exec helper and a
// whoami server, so that the root-only tests run real pod processes.
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == "pod-exec" {
		err := PodExecMain(os.Args[2:])
		fmt.Fprintln(os.Stderr, err)
		os.Exit(127)
	}
	if os.Getenv("ILB_AGENT_TEST_ROLE") == "id" {
		os.Exit(idRole())
	}
	if os.Getenv("ILB_AGENT_TEST_ROLE") == "whoami" {
		err := http.ListenAndServe(":8080", whoami.Handler(whoami.Hostname()))
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	os.Exit(m.Run())
}

// idRole plays a container started from an image (TestOCIContainerAsUser): it reports
// its user, effective capabilities, the token it was given and whether it may write
// FORBIDDEN.
func idRole() int {
	groups, _ := os.Getgroups()
	fmt.Printf("uid=%d gid=%d groups=%v\n", os.Getuid(), os.Getgid(), groups)
	status, _ := os.ReadFile("/proc/self/status")
	for _, line := range strings.Split(string(status), "\n") {
		if v, ok := strings.CutPrefix(line, "CapEff:"); ok {
			fmt.Printf("capeff=%s\n", strings.TrimSpace(v))
		}
	}
	token, err := os.ReadFile(os.Getenv("TOKEN"))
	fmt.Printf("token=%s %v\n", token, err)
	if err := os.WriteFile(os.Getenv("FORBIDDEN"), nil, 0o644); err != nil {
		fmt.Printf("write: %v\n", errors.Unwrap(err))
	}
	return 0
}
