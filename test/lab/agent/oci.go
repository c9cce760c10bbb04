package agent

import (
	"archive/tar"
	"bufio"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"
	"os"
	"path"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
)

// OCI image layouts (https://github.com/opencontainers/image-spec/blob/main/image-layout.md),
// as `make image` writes them. Only what running a container needs is read: index.json, the
// image index, the manifest for this machine's platform, the config and the layers. Every
// blob is checked against its digest as it is read.

const (
	mtOCIIndex        = "application/vnd.oci.image.index.v1+json"
	mtDockerList      = "application/vnd.docker.distribution.manifest.list.v2+json"
	mtOCIManifest     = "application/vnd.oci.image.manifest.v1+json"
	mtDockerManifest  = "application/vnd.docker.distribution.manifest.v2+json"
	mtOCILayerTar     = "application/vnd.oci.image.layer.v1.tar"
	mtOCILayerGzip    = "application/vnd.oci.image.layer.v1.tar+gzip"
	mtDockerLayerGzip = "application/vnd.docker.image.rootfs.diff.tar.gzip"
	refNameAnnotation = "org.opencontainers.image.ref.name"
)

type ociDescriptor struct {
	MediaType   string            `json:"mediaType"`
	Digest      string            `json:"digest"`
	Size        int64             `json:"size"`
	Annotations map[string]string `json:"annotations,omitempty"`
	Platform    *struct {
		OS           string `json:"os"`
		Architecture string `json:"architecture"`
	} `json:"platform,omitempty"`
}

type ociIndex struct {
	MediaType string          `json:"mediaType"`
	Manifests []ociDescriptor `json:"manifests"`
}

type ociManifest struct {
	MediaType string          `json:"mediaType"`
	Config    ociDescriptor   `json:"config"`
	Layers    []ociDescriptor `json:"layers"`
}

// OCIConfig is the part of an image's config that says how to run it.
type OCIConfig struct {
	Entrypoint []string `json:"Entrypoint"`
	Cmd        []string `json:"Cmd"`
	Env        []string `json:"Env"`
	User       string   `json:"User"`
	WorkingDir string   `json:"WorkingDir"`
}

// OCIImage is an image unpacked for running.
type OCIImage struct {
	// ID is repository@digest: the digest of the index when the layout holds one (what
	// `make image` prints), else of the manifest.
	ID string
	// Rootfs is the unpacked root file system (shared by every container of the image).
	Rootfs string
	Config OCIConfig
}

// ociStore unpacks images into dir/<manifest digest>/rootfs, once per digest.
type ociStore struct {
	dir string
	mu  sync.Mutex // one unpacking at a time
}

// open reads the image in the layout at layoutDir for this machine's platform and
// unpacks it unless it already is. repo names the image in its ID; tag selects the
// index.json entry whose ref.name annotation is tag when the layout holds several.
func (s *ociStore) open(layoutDir, repo, tag string) (*OCIImage, error) {
	l := ociLayout(layoutDir)
	top, err := l.entry(tag)
	if err != nil {
		return nil, err
	}
	idDigest, mdesc := top.Digest, top
	if top.MediaType == mtOCIIndex || top.MediaType == mtDockerList {
		if mdesc, err = l.platformManifest(top); err != nil {
			return nil, err
		}
	}
	var m ociManifest
	if err := l.readJSON(mdesc, &m, mtOCIManifest, mtDockerManifest); err != nil {
		return nil, err
	}
	var cfg struct {
		Config OCIConfig `json:"config"`
	}
	if err := l.readJSON(m.Config, &cfg); err != nil {
		return nil, err
	}
	hexDigest, err := digestHex(mdesc.Digest)
	if err != nil {
		return nil, err
	}
	dir := filepath.Join(s.dir, hexDigest)
	if err := s.unpack(l, m.Layers, dir); err != nil {
		return nil, fmt.Errorf("image %s in %s: %w", repo, layoutDir, err)
	}
	return &OCIImage{ID: repo + "@" + idDigest, Rootfs: filepath.Join(dir, "rootfs"), Config: cfg.Config}, nil
}

// unpack extracts layers into dir/rootfs through a temporary directory, so that dir
// exists only complete.
func (s *ociStore) unpack(l ociLayout, layers []ociDescriptor, dir string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, err := os.Stat(dir); err == nil {
		return nil
	}
	if err := os.MkdirAll(s.dir, 0o755); err != nil {
		return err
	}
	tmp, err := os.MkdirTemp(s.dir, ".unpack-")
	if err != nil {
		return err
	}
	defer func() { _ = os.RemoveAll(tmp) }() // gone after the rename; a failed unpack's leftovers
	rootfs := filepath.Join(tmp, "rootfs")
	if err := os.Mkdir(rootfs, 0o755); err != nil {
		return err
	}
	root, err := os.OpenRoot(rootfs)
	if err != nil {
		return err
	}
	defer func() { _ = root.Close() }() // read-only use is over once unpacked
	for _, d := range layers {
		if err := l.applyLayer(root, d); err != nil {
			return fmt.Errorf("layer %s: %w", d.Digest, err)
		}
	}
	// The rootfs directory itself must be traversable by a non-root user.
	if err := os.Chmod(tmp, 0o755); err != nil {
		return err
	}
	return os.Rename(tmp, dir)
}

type ociLayout string

func (l ociLayout) entry(tag string) (ociDescriptor, error) {
	var idx ociIndex
	data, err := os.ReadFile(filepath.Join(string(l), "index.json"))
	if err == nil {
		err = json.Unmarshal(data, &idx)
	}
	if err != nil {
		return ociDescriptor{}, fmt.Errorf("image layout %s: reading index.json: %w", l, err)
	}
	switch {
	case len(idx.Manifests) == 1:
		return idx.Manifests[0], nil
	case len(idx.Manifests) == 0:
		return ociDescriptor{}, fmt.Errorf("image layout %s: index.json lists no image", l)
	}
	var names []string
	for _, d := range idx.Manifests {
		if d.Annotations[refNameAnnotation] == tag {
			return d, nil
		}
		names = append(names, d.Annotations[refNameAnnotation])
	}
	return ociDescriptor{}, fmt.Errorf("image layout %s: no image tagged %q (tags: %s)", l, tag, strings.Join(names, ", "))
}

func (l ociLayout) platformManifest(idxDesc ociDescriptor) (ociDescriptor, error) {
	var idx ociIndex
	if err := l.readJSON(idxDesc, &idx, mtOCIIndex, mtDockerList); err != nil {
		return ociDescriptor{}, err
	}
	var have []string
	for _, d := range idx.Manifests {
		if d.Platform == nil {
			continue
		}
		if d.Platform.OS == "linux" && d.Platform.Architecture == runtime.GOARCH {
			return d, nil
		}
		have = append(have, d.Platform.OS+"/"+d.Platform.Architecture)
	}
	return ociDescriptor{}, fmt.Errorf("image layout %s: image index %s has no linux/%s image (has %s)", l, idxDesc.Digest, runtime.GOARCH, strings.Join(have, ", "))
}

func digestHex(d string) (string, error) {
	hexPart, ok := strings.CutPrefix(d, "sha256:")
	if !ok || len(hexPart) != 64 {
		return "", fmt.Errorf("digest %q: want sha256:<64 hex digits>", d)
	}
	if _, err := hex.DecodeString(hexPart); err != nil {
		return "", fmt.Errorf("digest %q: %w", d, err)
	}
	return hexPart, nil
}

// verifiedBlob reads a blob and fails at its end when size or digest differ from d.
type verifiedBlob struct {
	f    *os.File
	r    io.Reader
	h    hash.Hash
	d    ociDescriptor
	read int64
}

func (l ociLayout) open(d ociDescriptor) (*verifiedBlob, error) {
	hexPart, err := digestHex(d.Digest)
	if err != nil {
		return nil, err
	}
	f, err := os.Open(filepath.Join(string(l), "blobs", "sha256", hexPart))
	if err != nil {
		return nil, fmt.Errorf("image layout %s: %w", l, err)
	}
	b := &verifiedBlob{f: f, h: sha256.New(), d: d}
	b.r = io.TeeReader(f, b.h)
	return b, nil
}

func (b *verifiedBlob) Read(p []byte) (int, error) {
	n, err := b.r.Read(p)
	b.read += int64(n)
	if errors.Is(err, io.EOF) {
		if got := "sha256:" + hex.EncodeToString(b.h.Sum(nil)); got != b.d.Digest || (b.d.Size > 0 && b.read != b.d.Size) {
			return n, fmt.Errorf("blob %s is corrupt: %d bytes with digest %s, want %d bytes", b.d.Digest, b.read, got, b.d.Size)
		}
	}
	return n, err
}

func (b *verifiedBlob) Close() error { return b.f.Close() }

func (l ociLayout) readJSON(d ociDescriptor, v any, mediaTypes ...string) error {
	if len(mediaTypes) > 0 && !slices.Contains(mediaTypes, d.MediaType) {
		return fmt.Errorf("image layout %s: %s has media type %q, want one of %s", l, d.Digest, d.MediaType, strings.Join(mediaTypes, ", "))
	}
	b, err := l.open(d)
	if err != nil {
		return err
	}
	defer func() { _ = b.Close() }() // read-only
	data, err := io.ReadAll(b)
	if err != nil {
		return err
	}
	if err := json.Unmarshal(data, v); err != nil {
		return fmt.Errorf("image layout %s: %s: %w", l, d.Digest, err)
	}
	return nil
}

// applyLayer extracts one layer into root, with whiteouts (.wh.NAME deletes NAME,
// .wh..wh..opq empties its directory). os.Root keeps every path, symlinks included,
// inside the root file system. Devices and FIFOs are skipped.
func (l ociLayout) applyLayer(root *os.Root, d ociDescriptor) error {
	b, err := l.open(d)
	if err != nil {
		return err
	}
	defer func() { _ = b.Close() }() // read-only
	var r io.Reader = bufio.NewReader(b)
	switch d.MediaType {
	case mtOCILayerGzip, mtDockerLayerGzip:
		zr, err := gzip.NewReader(r)
		if err != nil {
			return err
		}
		r = zr
	case mtOCILayerTar:
	default:
		return fmt.Errorf("layer media type %q is not supported (want tar or tar+gzip)", d.MediaType)
	}
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return err
		}
		if err := extractEntry(root, h, tr); err != nil {
			return fmt.Errorf("%s: %w", h.Name, err)
		}
	}
	// Read to the end, so that the digest is checked.
	_, err = io.Copy(io.Discard, b)
	return err
}

func extractEntry(root *os.Root, h *tar.Header, r io.Reader) error {
	name := path.Clean(strings.TrimPrefix(h.Name, "/"))
	if name == "." {
		return nil
	}
	dir, base := path.Split(name)
	if dir == "" {
		dir = "."
	}
	switch {
	case base == ".wh..wh..opq":
		entries, err := fsReadDir(root, dir)
		if err != nil {
			return err
		}
		for _, e := range entries {
			if err := root.RemoveAll(path.Join(dir, e)); err != nil {
				return err
			}
		}
		return nil
	case strings.HasPrefix(base, ".wh."):
		return root.RemoveAll(path.Join(dir, strings.TrimPrefix(base, ".wh.")))
	}
	if err := root.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	mode := h.FileInfo().Mode()
	if h.Typeflag != tar.TypeDir {
		// A later layer replaces what an earlier one had at this path.
		if err := root.RemoveAll(name); err != nil {
			return err
		}
	}
	switch h.Typeflag {
	case tar.TypeDir:
		if err := root.MkdirAll(name, 0o755); err != nil {
			return err
		}
	case tar.TypeReg:
		f, err := root.OpenFile(name, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
		if err != nil {
			return err
		}
		_, err = io.Copy(f, r)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return err
		}
	case tar.TypeSymlink:
		if err := root.Symlink(h.Linkname, name); err != nil {
			return err
		}
		return root.Lchown(name, h.Uid, h.Gid)
	case tar.TypeLink:
		return root.Link(path.Clean(strings.TrimPrefix(h.Linkname, "/")), name)
	default:
		return nil
	}
	if err := root.Lchown(name, h.Uid, h.Gid); err != nil {
		return err
	}
	// After chown, which clears set-user-ID bits.
	return root.Chmod(name, mode.Perm()|mode&(os.ModeSetuid|os.ModeSetgid|os.ModeSticky))
}

func fsReadDir(root *os.Root, dir string) ([]string, error) {
	f, err := root.Open(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	defer func() { _ = f.Close() }() // read-only
	return f.Readdirnames(-1)
}

// resolveInRoot returns the host path of name (absolute, in the image) inside rootfs,
// following symbolic links as the container would see them: an absolute link target is
// taken from rootfs, and ".." never leaves it.
func resolveInRoot(rootfs, name string) (string, error) {
	parts := strings.Split(strings.TrimPrefix(path.Clean("/"+name), "/"), "/")
	cur := "/"
	for links := 0; len(parts) > 0; {
		p := parts[0]
		parts = parts[1:]
		if p == "" || p == "." {
			continue
		}
		next := path.Join(cur, p) // Join cleans "..", never above "/"
		fi, err := os.Lstat(filepath.Join(rootfs, next))
		if err != nil {
			return "", err
		}
		if fi.Mode()&os.ModeSymlink == 0 {
			cur = next
			continue
		}
		if links++; links > 40 {
			return "", fmt.Errorf("%s: too many levels of symbolic links", name)
		}
		target, err := os.Readlink(filepath.Join(rootfs, next))
		if err != nil {
			return "", err
		}
		if strings.HasPrefix(target, "/") {
			cur = "/"
		}
		parts = append(strings.Split(target, "/"), parts...)
	}
	return filepath.Join(rootfs, cur), nil
}

// lookup finds a container's command[0] in the image: a path as is, a bare name in the
// directories of PATH (the container's environment).
func (img *OCIImage) lookup(name, pathEnv string) (string, error) {
	try := func(p string) (string, error) {
		host, err := resolveInRoot(img.Rootfs, p)
		if err != nil {
			return "", err
		}
		return host, checkExecutable(host)
	}
	if strings.Contains(name, "/") {
		p, err := try(name)
		if err != nil {
			return "", fmt.Errorf("command %s in image %s: %w", name, img.ID, err)
		}
		return p, nil
	}
	for _, dir := range filepath.SplitList(pathEnv) {
		if p, err := try(path.Join("/", dir, name)); err == nil {
			return p, nil
		}
	}
	return "", fmt.Errorf("command %s: not found in image %s (PATH %s): %w", name, img.ID, pathEnv, os.ErrNotExist)
}

// checkSearchable fails when a directory above p denies other users search (x)
// permission: a container whose user is not root could not reach its program there.
func checkSearchable(p string) error {
	for dir := filepath.Dir(p); ; dir = filepath.Dir(dir) {
		st, err := os.Stat(dir)
		if err != nil {
			return err
		}
		if st.Mode().Perm()&0o001 == 0 {
			return fmt.Errorf("%s (mode %v) is not searchable by other users, so a container's non-root user cannot run %s: unpack images under a directory with o+x", dir, st.Mode().Perm(), p)
		}
		if dir == filepath.Dir(dir) {
			return nil
		}
	}
}

func checkExecutable(p string) error {
	st, err := os.Stat(p)
	if err != nil {
		return err
	}
	if st.IsDir() || st.Mode()&0o111 == 0 {
		return fmt.Errorf("%s is not an executable file", p)
	}
	return nil
}

// user returns the uid and gid of spec, a USER as in an image's config ("uid",
// "uid:gid", "name", "name:group"; names from the image's /etc/passwd and /etc/group).
// An empty spec is root. Without a group, the user's primary group from /etc/passwd,
// else 0.
func (img *OCIImage) user(spec string) (uid, gid int64, err error) {
	u, g, hasGroup := strings.Cut(spec, ":")
	if u == "" {
		u = "0"
	}
	uidStr, primary, err := img.lookupID("/etc/passwd", u, 2, 3)
	if err != nil {
		return 0, 0, err
	}
	if uid, err = strconv.ParseInt(uidStr, 10, 64); err != nil {
		return 0, 0, fmt.Errorf("image %s: user %q: %w", img.ID, u, err)
	}
	gidStr := primary
	if hasGroup {
		if gidStr, _, err = img.lookupID("/etc/group", g, 2, 2); err != nil {
			return 0, 0, err
		}
	}
	if gidStr == "" {
		gidStr = "0"
	}
	if gid, err = strconv.ParseInt(gidStr, 10, 64); err != nil {
		return 0, 0, fmt.Errorf("image %s: group %q: %w", img.ID, g, err)
	}
	return uid, gid, nil
}

// home returns uid's home directory from the image's /etc/passwd, "/" when it lists
// none (as containerd does).
func (img *OCIImage) home(uid int64) string {
	data, _ := os.ReadFile(filepath.Join(img.Rootfs, "etc", "passwd")) // no file: no entry
	for _, line := range strings.Split(string(data), "\n") {
		if f := strings.Split(line, ":"); len(f) >= 6 && f[2] == strconv.FormatInt(uid, 10) && f[5] != "" {
			return f[5]
		}
	}
	return "/"
}

// lookupID resolves name through the colon-separated file (passwd, group): a number is
// itself (with the primary group when the file lists it), a name its idField.
func (img *OCIImage) lookupID(file, name string, idField, primaryField int) (id, primary string, err error) {
	_, numErr := strconv.ParseUint(name, 10, 32)
	data, rerr := os.ReadFile(filepath.Join(img.Rootfs, file))
	for _, line := range strings.Split(string(data), "\n") {
		f := strings.Split(line, ":")
		if len(f) <= max(idField, primaryField) {
			continue
		}
		if f[0] == name || (numErr == nil && f[idField] == name) {
			return f[idField], f[primaryField], nil
		}
	}
	if numErr == nil {
		return name, "", nil
	}
	if rerr != nil {
		return "", "", fmt.Errorf("image %s: %q is not a number and %s cannot be read: %w", img.ID, name, file, rerr)
	}
	return "", "", fmt.Errorf("image %s: %q is not in %s", img.ID, name, file)
}
