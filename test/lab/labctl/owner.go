package labctl

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/ironlb/ironlb/test/lab/labnet"
)

// ownerFile records which checkout's lab owns the machine-wide lab names (namespaces such as
// ilb-myk8s-worker exist once per machine, so only one lab can run at a time). Up claims it
// and refuses to tear down another checkout's running lab; Down releases it.
const ownerFile = "/run/ilb-lab/owner"

// Owner returns the repository root of the checkout whose lab owns the lab names, or "".
func Owner() string {
	b, err := os.ReadFile(ownerFile)
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

// otherOwner returns the root of another checkout whose lab is present (its namespaces exist),
// or "" when the names are free or ours.
func (l *Lab) otherOwner(ctx context.Context) string {
	o := Owner()
	if o == "" || o == l.Root {
		return ""
	}
	if nss, _ := labnet.LabNamespaces(ctx); len(nss) == 0 {
		return "" // a stale claim: that lab is gone
	}
	return o
}

func (l *Lab) claimOwner() error {
	if err := os.MkdirAll(filepath.Dir(ownerFile), 0o755); err != nil {
		return fmt.Errorf("recording the lab's owner: %w", err)
	}
	return os.WriteFile(ownerFile, []byte(l.Root+"\n"), 0o644)
}

func (l *Lab) releaseOwner(force bool) {
	if o := Owner(); o == l.Root || force {
		if err := os.Remove(ownerFile); err != nil && !errors.Is(err, os.ErrNotExist) {
			l.printf("warning: removing %s: %v\n", ownerFile, err)
		}
	}
}

func errOtherOwner(other, action string) error {
	return fmt.Errorf("the lab on this machine belongs to the checkout %s (its namespaces exist); %s: run `bin/lab down` there, or `bin/lab down --force` here to remove it anyway", other, action)
}
