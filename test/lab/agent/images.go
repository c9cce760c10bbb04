package agent

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"
)

// ImageEntry says which local program stands in for an image.
type ImageEntry struct {
	// Program is the image's entrypoint: an absolute path or a name looked up in PATH.
	Program string `json:"program"`
	// Args are the image's default arguments (its CMD), replaced by a container's args.
	Args []string `json:"args,omitempty"`
	// Commands maps names a container may use as command[0] (e.g. "/whoami") to
	// local programs, for images whose manifests name their entrypoint explicitly.
	Commands map[string]string `json:"commands,omitempty"`
}

// ImageTable maps image repositories (no tag or digest) to local programs.
type ImageTable struct {
	Images map[string]ImageEntry `json:"images"`
}

// LoadImageTable reads an image table from a YAML or JSON file.
func LoadImageTable(path string) (*ImageTable, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("reading image table %q: %w", path, err)
	}
	return ParseImageTable(data)
}

// ParseImageTable parses an image table from YAML or JSON. Keys are
// normalised, so "docker.io/traefik/whoami" and "traefik/whoami" are the same.
func ParseImageTable(data []byte) (*ImageTable, error) {
	var t ImageTable
	if err := yaml.UnmarshalStrict(data, &t); err != nil {
		return nil, fmt.Errorf("parsing image table: %w", err)
	}
	norm := make(map[string]ImageEntry, len(t.Images))
	for k, v := range t.Images {
		if v.Program == "" {
			return nil, fmt.Errorf("image table entry %q: program is empty", k)
		}
		norm[NormalizeImage(k)] = v
	}
	t.Images = norm
	return &t, nil
}

// NormalizeImage strips the tag and digest from an image reference and the
// implicit Docker Hub parts ("docker.io/", "library/"), so that every spelling
// of one repository compares equal.
func NormalizeImage(image string) string {
	ref := strings.TrimSpace(image)
	if i := strings.Index(ref, "@"); i >= 0 {
		ref = ref[:i]
	}
	// A tag is a colon after the last slash (a colon before it is a registry port).
	if i := strings.LastIndex(ref, ":"); i > strings.LastIndex(ref, "/") {
		ref = ref[:i]
	}
	for _, p := range []string{"docker.io/", "index.docker.io/", "registry-1.docker.io/"} {
		ref = strings.TrimPrefix(ref, p)
	}
	ref = strings.TrimPrefix(ref, "library/")
	return ref
}

// Known returns the table's repositories, sorted, for error messages.
func (t *ImageTable) Known() []string {
	out := make([]string, 0, len(t.Images))
	for k := range t.Images {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// ImageError is an image that is not in the table; the pod shows it as an
// image pull error.
type ImageError struct {
	Image string
	Known []string
}

func (e *ImageError) Error() string {
	return fmt.Sprintf("image %s is not in the lab's image table (known: %s)", e.Image, strings.Join(e.Known, ", "))
}

// CommandError is a container command that names no program the lab has.
type CommandError struct {
	Image, Command string
}

func (e *CommandError) Error() string {
	return fmt.Sprintf("command %q of image %s is neither a local program nor in the image table's commands for it", e.Command, e.Image)
}

// Resolve returns the program and arguments that run container c: the
// container's command replaces the image's program and default args, its args
// replace the default args (Kubernetes semantics). $(VAR) references are
// expanded with env. Command names are resolved through the entry's Commands,
// then as local programs, then by matching the base name of the entry's program.
func (t *ImageTable) Resolve(c *corev1.Container, env map[string]string) (string, []string, error) {
	repo := NormalizeImage(c.Image)
	entry, ok := t.Images[repo]
	if !ok {
		return "", nil, &ImageError{Image: c.Image, Known: t.Known()}
	}
	var argv []string
	if len(c.Command) > 0 {
		argv = append(argv, ExpandAll(c.Command, env)...)
		argv = append(argv, ExpandAll(c.Args, env)...)
	} else {
		argv = append(argv, entry.Program)
		if c.Args != nil {
			argv = append(argv, ExpandAll(c.Args, env)...)
		} else {
			argv = append(argv, entry.Args...)
		}
	}
	prog, err := t.program(entry, c.Image, argv[0], len(c.Command) > 0)
	if err != nil {
		return "", nil, err
	}
	return prog, argv[1:], nil
}

func (t *ImageTable) program(entry ImageEntry, image, name string, fromCommand bool) (string, error) {
	if !fromCommand {
		return lookProgram(name)
	}
	if p, ok := entry.Commands[name]; ok {
		return lookProgram(p)
	}
	if p, err := lookProgram(name); err == nil {
		return p, nil
	}
	if filepath.Base(name) == filepath.Base(entry.Program) {
		return lookProgram(entry.Program)
	}
	return "", &CommandError{Image: image, Command: name}
}

func lookProgram(name string) (string, error) {
	if strings.Contains(name, "/") {
		st, err := os.Stat(name)
		if err != nil {
			return "", fmt.Errorf("program %s: %w", name, err)
		}
		if st.IsDir() || st.Mode()&0o111 == 0 {
			return "", fmt.Errorf("program %s is not an executable file", name)
		}
		return name, nil
	}
	p, err := exec.LookPath(name)
	if err != nil {
		return "", fmt.Errorf("program %s: %w", name, err)
	}
	return p, nil
}
