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

// ImageEntry says how the lab runs an image: from an OCI image layout (Layout), or
// with a local program standing in for it (Program, Args, Commands).
type ImageEntry struct {
	// Layout is an OCI image layout directory holding the image (`make image` writes
	// bin/image/oci): its layers are unpacked and its entrypoint, env and user used.
	Layout string `json:"layout,omitempty"`
	// Program is the image's entrypoint: an absolute path or a name looked up in PATH.
	Program string `json:"program,omitempty"`
	// Args are the image's default arguments (its CMD), replaced by a container's args.
	Args []string `json:"args,omitempty"`
	// Commands maps names a container may use as command[0] (e.g. "/whoami") to
	// local programs, for images whose manifests name their entrypoint explicitly.
	Commands map[string]string `json:"commands,omitempty"`
}

// ImageTable maps image repositories (no tag or digest) to OCI image layouts or local
// programs.
type ImageTable struct {
	Images map[string]ImageEntry `json:"images"`

	// oci unpacks layout images; set by UnpackInto.
	oci *ociStore
}

// UnpackInto sets the directory layout images are unpacked into (one root file system
// per image digest; the agent uses <state-dir>/images).
func (t *ImageTable) UnpackInto(dir string) { t.oci = &ociStore{dir: dir} }

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
		switch {
		case v.Program == "" && v.Layout == "":
			return nil, fmt.Errorf("image table entry %q: want layout (an OCI image layout) or program, both are empty", k)
		case v.Program != "" && v.Layout != "":
			return nil, fmt.Errorf("image table entry %q: layout %q and program %q: want one of them", k, v.Layout, v.Program)
		case v.Layout != "" && (len(v.Args) > 0 || len(v.Commands) > 0):
			return nil, fmt.Errorf("image table entry %q: args and commands are for programs; layout %q has its own", k, v.Layout)
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

// imageTag returns the tag of an image reference, "" when it has none.
func imageTag(ref string) string {
	ref, _, _ = strings.Cut(ref, "@")
	if i := strings.LastIndex(ref, ":"); i > strings.LastIndex(ref, "/") {
		return ref[i+1:]
	}
	return ""
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

// ImageError is an image that is not in the table, or whose layout cannot be
// read; the pod shows it as an image pull error.
type ImageError struct {
	Image string
	Known []string
	Err   error // the layout's error
}

func (e *ImageError) Error() string {
	if e.Err != nil {
		return fmt.Sprintf("image %s: %v", e.Image, e.Err)
	}
	return fmt.Sprintf("image %s is not in the lab's image table (known: %s)", e.Image, strings.Join(e.Known, ", "))
}

func (e *ImageError) Unwrap() error { return e.Err }

// CommandError is a container command that names no program the lab has.
type CommandError struct {
	Image, Command string
}

func (e *CommandError) Error() string {
	if e.Command == "" {
		return fmt.Sprintf("image %s has no entrypoint and the container no command", e.Image)
	}
	return fmt.Sprintf("command %q of image %s is neither a local program nor in the image table's commands for it", e.Command, e.Image)
}

// Image is a container's image as the lab runs it: an unpacked OCI image, or a
// local program standing in for it.
type Image struct {
	name  string
	entry ImageEntry
	// OCI is the unpacked image, nil for a stand-in.
	OCI *OCIImage
}

// Lookup finds image (a container's image reference) in the table and, for an OCI image
// layout, unpacks it (once per digest). A layout is read again on every call, so a
// container started after `make image` runs the new image.
func (t *ImageTable) Lookup(image string) (*Image, error) {
	repo := NormalizeImage(image)
	entry, ok := t.Images[repo]
	if !ok {
		return nil, &ImageError{Image: image, Known: t.Known()}
	}
	img := &Image{name: image, entry: entry}
	if entry.Layout == "" {
		return img, nil
	}
	if t.oci == nil {
		return nil, fmt.Errorf("image %s: the image table has no directory to unpack layouts into", image)
	}
	oci, err := t.oci.open(entry.Layout, repo, imageTag(image))
	if err != nil {
		return nil, &ImageError{Image: image, Err: err}
	}
	img.OCI = oci
	return img, nil
}

// Env is the image's environment (its config's Env), under the container's own; nil
// for stand-ins.
func (img *Image) Env() []string {
	if img.OCI == nil {
		return nil
	}
	return img.OCI.Config.Env
}

// ID is the container status' imageID: repository@digest for an OCI image,
// lab://PROGRAM for a stand-in.
func (img *Image) ID(prog string) string {
	if img.OCI != nil {
		return img.OCI.ID
	}
	return "lab://" + prog
}

// Resolve is Lookup, then Image.Resolve.
func (t *ImageTable) Resolve(c *corev1.Container, env map[string]string) (string, []string, error) {
	img, err := t.Lookup(c.Image)
	if err != nil {
		return "", nil, err
	}
	return img.Resolve(c, env)
}

// Resolve returns the program and arguments that run container c: the
// container's command replaces the image's entrypoint (program) and default args
// (cmd), its args replace the default args (Kubernetes semantics). $(VAR)
// references are expanded with env. An OCI image's command is found in its root
// file system (a bare name through env's PATH). A stand-in's command names are
// resolved through the entry's Commands, then as local programs, then by matching
// the base name of the entry's program.
func (img *Image) Resolve(c *corev1.Container, env map[string]string) (string, []string, error) {
	entrypoint, defArgs := []string{img.entry.Program}, img.entry.Args
	if img.OCI != nil {
		entrypoint, defArgs = img.OCI.Config.Entrypoint, img.OCI.Config.Cmd
	}
	var argv []string
	if len(c.Command) > 0 {
		argv = append(argv, ExpandAll(c.Command, env)...)
		argv = append(argv, ExpandAll(c.Args, env)...)
	} else {
		argv = append(argv, entrypoint...)
		if c.Args != nil {
			argv = append(argv, ExpandAll(c.Args, env)...)
		} else {
			argv = append(argv, defArgs...)
		}
	}
	if len(argv) == 0 {
		return "", nil, &CommandError{Image: img.name, Command: ""}
	}
	if img.OCI != nil {
		prog, err := img.OCI.lookup(argv[0], env["PATH"])
		if err != nil {
			return "", nil, err
		}
		return prog, argv[1:], nil
	}
	prog, err := img.entry.program(img.name, argv[0], len(c.Command) > 0)
	if err != nil {
		return "", nil, err
	}
	return prog, argv[1:], nil
}

func (entry ImageEntry) program(image, name string, fromCommand bool) (string, error) {
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
		if err := checkExecutable(name); err != nil {
			return "", fmt.Errorf("program %s: %w", name, err)
		}
		return name, nil
	}
	p, err := exec.LookPath(name)
	if err != nil {
		return "", fmt.Errorf("program %s: %w", name, err)
	}
	return p, nil
}
