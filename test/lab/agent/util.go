package agent

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
)

func sortStrings(s []string) { sort.Strings(s) }

// writeFileAtomic replaces path with data so that readers see either the old
// or the new content, never a partial file.
func writeFileAtomic(path string, data []byte, mode os.FileMode) error {
	dir := filepath.Dir(path)
	f, err := os.CreateTemp(dir, ".tmp-"+filepath.Base(path)+"-")
	if err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	tmp := f.Name()
	_, werr := f.Write(data)
	cerr := f.Close()
	if werr == nil {
		werr = cerr
	}
	if werr == nil {
		werr = os.Chmod(tmp, mode)
	}
	if werr == nil {
		werr = os.Rename(tmp, path)
	}
	if werr != nil {
		_ = os.Remove(tmp) // the write error is the one to report
		return fmt.Errorf("writing %s: %w", path, werr)
	}
	return nil
}
