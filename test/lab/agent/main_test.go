package agent

import (
	"fmt"
	"net/http"
	"os"
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
	if os.Getenv("ILB_AGENT_TEST_ROLE") == "whoami" {
		err := http.ListenAndServe(":8080", whoami.Handler(whoami.Hostname()))
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	os.Exit(m.Run())
}
