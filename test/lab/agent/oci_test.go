package agent

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"
)

// testLayout writes an OCI image layout by hand (the agent reads what `make image`
// writes; the image tool has its own tests): an index with this machine's platform and
// one other, layers as given, and the config.
type testLayout struct {
	t   *testing.T
	dir string
	// plain makes uncompressed layers (big test binaries are slow to gzip).
	plain bool
}

func newTestLayout(t *testing.T) *testLayout {
	t.Helper()
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "blobs", "sha256"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "oci-layout"), []byte(`{"imageLayoutVersion":"1.0.0"}`), 0o644); err != nil {
		t.Fatal(err)
	}
	return &testLayout{t: t, dir: dir}
}

func (l *testLayout) blob(mediaType string, data []byte) ociDescriptor {
	sum := sha256.Sum256(data)
	h := hex.EncodeToString(sum[:])
	if err := os.WriteFile(filepath.Join(l.dir, "blobs", "sha256", h), data, 0o644); err != nil {
		l.t.Fatal(err)
	}
	return ociDescriptor{MediaType: mediaType, Digest: "sha256:" + h, Size: int64(len(data))}
}

func (l *testLayout) json(mediaType string, v any) ociDescriptor {
	data, err := json.Marshal(v)
	if err != nil {
		l.t.Fatal(err)
	}
	return l.blob(mediaType, data)
}

type tarFile struct {
	name, data, link string
	typ              byte
	mode             int64
}

func (l *testLayout) layer(files ...tarFile) ociDescriptor {
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	var tw *tar.Writer
	if l.plain {
		tw = tar.NewWriter(&buf)
	} else {
		tw = tar.NewWriter(zw)
	}
	for _, f := range files {
		typ := f.typ
		if typ == 0 {
			typ = tar.TypeReg
		}
		mode := f.mode
		if mode == 0 {
			mode = 0o644
		}
		if err := tw.WriteHeader(&tar.Header{Name: f.name, Typeflag: typ, Mode: mode, Size: int64(len(f.data)), Linkname: f.link}); err != nil {
			l.t.Fatal(err)
		}
		if _, err := tw.Write([]byte(f.data)); err != nil {
			l.t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		l.t.Fatal(err)
	}
	if l.plain {
		return l.blob(mtOCILayerTar, buf.Bytes())
	}
	if err := zw.Close(); err != nil {
		l.t.Fatal(err)
	}
	return l.blob(mtOCILayerGzip, buf.Bytes())
}

// image writes config and manifest, an index holding them for this platform (and an
// empty one for another), and index.json; it returns the index's digest.
func (l *testLayout) image(cfg OCIConfig, layers ...ociDescriptor) string {
	config := l.json("application/vnd.oci.image.config.v1+json", map[string]any{
		"architecture": runtime.GOARCH, "os": "linux", "config": cfg,
	})
	manifest := l.json(mtOCIManifest, ociManifest{MediaType: mtOCIManifest, Config: config, Layers: layers})
	other := "s390x"
	if runtime.GOARCH == other {
		other = "arm64"
	}
	otherManifest := l.json(mtOCIManifest, ociManifest{MediaType: mtOCIManifest, Config: config})
	type plat = struct {
		OS           string `json:"os"`
		Architecture string `json:"architecture"`
	}
	manifest.Platform = &plat{"linux", runtime.GOARCH}
	otherManifest.Platform = &plat{"linux", other}
	idx := l.json(mtOCIIndex, ociIndex{MediaType: mtOCIIndex, Manifests: []ociDescriptor{otherManifest, manifest}})
	idx.Annotations = map[string]string{refNameAnnotation: "0.1.0"}
	data, _ := json.Marshal(ociIndex{Manifests: []ociDescriptor{idx}})
	if err := os.WriteFile(filepath.Join(l.dir, "index.json"), data, 0o644); err != nil {
		l.t.Fatal(err)
	}
	return idx.Digest
}

const testPasswd = "root:x:0:0:root:/root:/sbin/nologin\nnobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n"

func ociTable(t *testing.T, layoutDir string) *ImageTable {
	t.Helper()
	tbl, err := ParseImageTable([]byte("images:\n  ghcr.io/ironlb/ironlb: {layout: " + layoutDir + "}\n"))
	if err != nil {
		t.Fatal(err)
	}
	tbl.UnpackInto(filepath.Join(t.TempDir(), "images"))
	return tbl
}

func TestOCIImage(t *testing.T) {
	l := newTestLayout(t)
	base := l.layer(
		tarFile{name: "etc/", typ: tar.TypeDir, mode: 0o755},
		tarFile{name: "etc/passwd", data: testPasswd},
		tarFile{name: "etc/group", data: "root:x:0:\nnonroot:x:65532:\n"},
		tarFile{name: "tmp/", typ: tar.TypeDir, mode: 0o1777},
		tarFile{name: "ironlb", data: "#!/bin/sh\necho old\n", mode: 0o755},
		tarFile{name: "gone", data: "deleted by the next layer"},
		tarFile{name: "opaque/old", data: "hidden by the next layer"},
		tarFile{name: "usr/local/bin/ironlb-link", typ: tar.TypeSymlink, link: "/ironlb"},
	)
	top := l.layer(
		tarFile{name: "ironlb", data: "#!/bin/sh\necho new\n", mode: 0o755},
		tarFile{name: ".wh.gone"},
		tarFile{name: "opaque/.wh..wh..opq"},
		tarFile{name: "opaque/new", data: "kept"},
	)
	idxDigest := l.image(OCIConfig{Entrypoint: []string{"/ironlb"}, Cmd: []string{"--help"}, User: "65532:65532",
		Env: []string{"PATH=/usr/local/bin:/usr/bin", "IMAGE_ONLY=1"}, WorkingDir: "/"}, base, top)
	tbl := ociTable(t, l.dir)

	img, err := tbl.Lookup("ghcr.io/ironlb/ironlb:0.1.0")
	if err != nil {
		t.Fatalf("Lookup: %v", err)
	}
	if img.OCI == nil || img.ID("") != "ghcr.io/ironlb/ironlb@"+idxDigest {
		t.Fatalf("Lookup = %+v, want the OCI image with ID ghcr.io/ironlb/ironlb@%s", img, idxDigest)
	}
	if !strings.Contains(strings.Join(img.Env(), " "), "IMAGE_ONLY=1") {
		t.Errorf("Env = %q", img.Env())
	}
	rootfs := img.OCI.Rootfs
	read := func(p string) string { b, _ := os.ReadFile(filepath.Join(rootfs, p)); return string(b) }
	if got := read("ironlb"); !strings.Contains(got, "new") {
		t.Errorf("/ironlb = %q, want the upper layer's", got)
	}
	for _, p := range []string{"gone", "opaque/old"} {
		if _, err := os.Lstat(filepath.Join(rootfs, p)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s survived its whiteout: %v", p, err)
		}
	}
	if read("opaque/new") != "kept" {
		t.Error("opaque/new is missing")
	}
	if st, err := os.Stat(filepath.Join(rootfs, "tmp")); err != nil || st.Mode()&os.ModeSticky == 0 || st.Mode().Perm() != 0o777 {
		t.Errorf("/tmp: %v %v, want drwxrwxrwt", st.Mode(), err)
	}

	pathEnv := map[string]string{"PATH": "/usr/local/bin:/usr/bin"}
	for _, tc := range []struct {
		name     string
		c        corev1.Container
		wantProg string
		wantArgs []string
	}{
		{"entrypoint and cmd", corev1.Container{}, "ironlb", []string{"--help"}},
		{"args replace cmd", corev1.Container{Args: []string{"speaker", "--port=$(PORT)"}}, "ironlb", []string{"speaker", "--port=7472"}},
		{"command replaces both", corev1.Container{Command: []string{"/ironlb"}, Args: []string{"controller"}}, "ironlb", []string{"controller"}},
		{"bare name through PATH and an absolute symlink", corev1.Container{Command: []string{"ironlb-link"}}, "ironlb", []string{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.c.Image = "ghcr.io/ironlb/ironlb:0.1.0"
			env := map[string]string{"PORT": "7472", "PATH": pathEnv["PATH"]}
			prog, args, err := img.Resolve(&tc.c, env)
			if err != nil {
				t.Fatal(err)
			}
			if prog != filepath.Join(rootfs, tc.wantProg) || strings.Join(args, " ") != strings.Join(tc.wantArgs, " ") {
				t.Errorf("Resolve = %s %q, want %s %q", prog, args, filepath.Join(rootfs, tc.wantProg), tc.wantArgs)
			}
		})
	}
	if _, _, err := img.Resolve(&corev1.Container{Command: []string{"sh"}}, pathEnv); err == nil || !strings.Contains(err.Error(), "not found in image") {
		t.Errorf("a command the image lacks (the host has sh): %v", err)
	}

	// kubectl exec runs the image's program when the image has it (by path or
	// through the container's PATH), else the host's (sh for exec probes).
	runner := &containerRunner{w: &podWorker{a: &Agent{images: tbl}}, spec: corev1.Container{Name: "c", Image: "ghcr.io/ironlb/ironlb:0.1.0"},
		proc: &os.Process{Pid: os.Getpid()}, execEnv: []string{"PATH=/usr/local/bin:/usr/bin"}}
	for cmd, want := range map[string]string{
		"/ironlb": filepath.Join(rootfs, "ironlb"), "ironlb-link": filepath.Join(rootfs, "ironlb"), "sh": "sh",
	} {
		c, err := runner.execCommand([]string{cmd, "status"})
		if err != nil {
			t.Fatal(err)
		}
		if i := slices.Index(c.Args, "--"); i < 0 || c.Args[i+1] != want || c.Args[i+2] != "status" {
			t.Errorf("exec %s: nsenter %q, want %s status", cmd, c.Args, want)
		}
	}

	// The user: the image's, the pod's, the container's; fsGroup and supplementalGroups.
	pod := func(sc *corev1.PodSecurityContext) *corev1.Pod {
		return &corev1.Pod{Spec: corev1.PodSpec{SecurityContext: sc}}
	}
	for _, tc := range []struct {
		name string
		pod  *corev1.Pod
		c    corev1.Container
		want Cred
	}{
		{"image user", pod(nil), corev1.Container{}, Cred{UID: 65532, GID: 65532}},
		{"the chart's controller", pod(&corev1.PodSecurityContext{RunAsNonRoot: ptr.To(true), RunAsUser: ptr.To[int64](65534), FSGroup: ptr.To[int64](65534)}),
			corev1.Container{}, Cred{UID: 65534, GID: 65534, Groups: []int64{65534}}},
		{"the chart's speaker", pod(&corev1.PodSecurityContext{RunAsUser: ptr.To[int64](0)}), corev1.Container{}, Cred{}},
		{"container over pod, uid not in passwd", pod(&corev1.PodSecurityContext{RunAsUser: ptr.To[int64](5), SupplementalGroups: []int64{7, 8}}),
			corev1.Container{SecurityContext: &corev1.SecurityContext{RunAsUser: ptr.To[int64](1000)}}, Cred{UID: 1000, GID: 0, Groups: []int64{7, 8}}},
		{"runAsGroup", pod(nil), corev1.Container{SecurityContext: &corev1.SecurityContext{RunAsGroup: ptr.To[int64](42)}}, Cred{UID: 65532, GID: 42}},
	} {
		got, err := containerCred(tc.pod, &tc.c, img)
		if err != nil || got == nil || got.String() != tc.want.String() {
			t.Errorf("%s: containerCred = %v, %v, want %v", tc.name, got, err, tc.want)
		}
	}
	if _, err := containerCred(pod(&corev1.PodSecurityContext{RunAsNonRoot: ptr.To(true), RunAsUser: ptr.To[int64](0)}), &corev1.Container{Name: "c"}, img); err == nil || !strings.Contains(err.Error(), "runAsNonRoot") {
		t.Errorf("runAsNonRoot with uid 0: %v", err)
	}
	for spec, want := range map[string]string{"nonroot": "65532:65532", "65534": "65534:65534", "nonroot:root": "65532:0", "": "0:0"} {
		uid, gid, err := img.OCI.user(spec)
		if got := (&Cred{UID: uid, GID: gid}).String(); err != nil || got != want {
			t.Errorf("user(%q) = %s, %v, want %s", spec, got, err, want)
		}
	}
	if h, h2 := img.OCI.home(65534), img.OCI.home(1000); h != "/nonexistent" || h2 != "/" {
		t.Errorf("home(65534) = %q, home(1000) = %q; want /nonexistent and /", h, h2)
	}
	if _, _, err := img.OCI.user("ghost"); err == nil || !strings.Contains(err.Error(), `"ghost" is not in /etc/passwd`) {
		t.Errorf("user(ghost): %v", err)
	}

	// Unpacked once per digest: a second lookup reuses the root file system.
	if err := os.WriteFile(filepath.Join(rootfs, "marker"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	again, err := tbl.Lookup("ghcr.io/ironlb/ironlb:dev")
	if err != nil || again.OCI.Rootfs != rootfs {
		t.Fatalf("second Lookup: %+v %v", again, err)
	}
	if _, err := os.Stat(filepath.Join(rootfs, "marker")); err != nil {
		t.Error("the second lookup unpacked the image again")
	}
	// Stand-ins run as root, as before.
	if c, err := containerCred(pod(nil), &corev1.Container{}, &Image{}); c != nil || err != nil {
		t.Errorf("stand-in: %v %v", c, err)
	}
}

func TestOCIImageErrors(t *testing.T) {
	t.Run("corrupt blob", func(t *testing.T) {
		l := newTestLayout(t)
		layer := l.layer(tarFile{name: "ironlb", data: "x", mode: 0o755})
		l.image(OCIConfig{Entrypoint: []string{"/ironlb"}}, layer)
		h, _ := digestHex(layer.Digest)
		if err := os.WriteFile(filepath.Join(l.dir, "blobs", "sha256", h), []byte("not the layer"), 0o644); err != nil {
			t.Fatal(err)
		}
		_, err := ociTable(t, l.dir).Lookup("ghcr.io/ironlb/ironlb:0.1.0")
		var ie *ImageError
		if !errors.As(err, &ie) || !strings.Contains(err.Error(), layer.Digest) {
			t.Errorf("corrupt layer: %v, want an ImageError naming %s", err, layer.Digest)
		}
	})
	t.Run("a symlink out of the root file system", func(t *testing.T) {
		l := newTestLayout(t)
		outside := t.TempDir()
		l.image(OCIConfig{Entrypoint: []string{"/x"}}, l.layer(
			tarFile{name: "esc", typ: tar.TypeSymlink, link: outside},
			tarFile{name: "esc/pwned", data: "x"},
		))
		if _, err := ociTable(t, l.dir).Lookup("ghcr.io/ironlb/ironlb:0.1.0"); err == nil {
			t.Error("a layer writing through a symlink out of the root: want an error")
		}
		if _, err := os.Stat(filepath.Join(outside, "pwned")); err == nil {
			t.Error("the layer wrote outside the root file system")
		}
	})
	t.Run("no image for this platform", func(t *testing.T) {
		l := newTestLayout(t)
		cfg := l.json("application/vnd.oci.image.config.v1+json", map[string]any{})
		m := l.json(mtOCIManifest, ociManifest{MediaType: mtOCIManifest, Config: cfg})
		m.Platform = &struct {
			OS           string `json:"os"`
			Architecture string `json:"architecture"`
		}{"linux", "riscv64"}
		idx := l.json(mtOCIIndex, ociIndex{MediaType: mtOCIIndex, Manifests: []ociDescriptor{m}})
		data, _ := json.Marshal(ociIndex{Manifests: []ociDescriptor{idx}})
		if err := os.WriteFile(filepath.Join(l.dir, "index.json"), data, 0o644); err != nil {
			t.Fatal(err)
		}
		_, err := ociTable(t, l.dir).Lookup("ghcr.io/ironlb/ironlb")
		if err == nil || !strings.Contains(err.Error(), "no linux/"+runtime.GOARCH+" image (has linux/riscv64)") {
			t.Errorf("wrong platform: %v", err)
		}
	})
	t.Run("no layout", func(t *testing.T) {
		_, err := ociTable(t, filepath.Join(t.TempDir(), "missing")).Lookup("ghcr.io/ironlb/ironlb")
		if err == nil || !strings.Contains(err.Error(), "index.json") {
			t.Errorf("missing layout: %v", err)
		}
	})
	for _, bad := range []string{
		"images:\n  x: {layout: /a, program: /b}\n",
		"images:\n  x: {layout: /a, args: [y]}\n",
	} {
		if _, err := ParseImageTable([]byte(bad)); err == nil {
			t.Errorf("ParseImageTable(%q): want an error", bad)
		}
	}
}

// TestOCIContainerAsUser runs a program from an unpacked image the way the agent does
// (pod-exec with a bind mount and the image's user): it runs as that user, with no
// capabilities, reads its read-only volume and cannot write where root owns the place.
func TestOCIContainerAsUser(t *testing.T) {
	requireRoot(t)
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	bin, err := os.ReadFile(self)
	if err != nil {
		t.Fatal(err)
	}
	l := newTestLayout(t)
	l.plain = true
	l.image(OCIConfig{Entrypoint: []string{"/ironlb"}, User: "nonroot", Env: []string{"ILB_AGENT_TEST_ROLE=id"}},
		l.layer(tarFile{name: "etc/passwd", data: testPasswd}, tarFile{name: "ironlb", data: string(bin), mode: 0o755}))
	tbl := ociTable(t, l.dir)
	img, err := tbl.Lookup("ghcr.io/ironlb/ironlb")
	if err != nil {
		t.Fatal(err)
	}
	// The test's temporary directories are private (0700); the lab's state directory is
	// not. The agent refuses a program a non-root user could not reach.
	if err := checkSearchable(img.OCI.Rootfs + "/ironlb"); err == nil || !strings.Contains(err.Error(), "not searchable") {
		t.Fatalf("checkSearchable under a 0700 directory: %v", err)
	}
	makeSearchable(t, filepath.Dir(img.OCI.Rootfs))
	if err := checkSearchable(img.OCI.Rootfs + "/ironlb"); err != nil {
		t.Fatal(err)
	}
	c := &corev1.Container{Name: "controller"}
	p := &corev1.Pod{Spec: corev1.PodSpec{SecurityContext: &corev1.PodSecurityContext{FSGroup: ptr.To[int64](2000)}}}
	prog, args, err := img.Resolve(c, nil)
	if err != nil {
		t.Fatal(err)
	}
	user, err := containerCred(p, c, img)
	if err != nil {
		t.Fatal(err)
	}
	src := t.TempDir()
	if err := os.WriteFile(filepath.Join(src, "token"), []byte("tok-123"), 0o644); err != nil {
		t.Fatal(err)
	}
	dst := filepath.Join(t.TempDir(), "serviceaccount")
	w := &podWorker{a: &Agent{cfg: Config{Self: self}}, pod: &corev1.Pod{Spec: corev1.PodSpec{HostNetwork: true}}}
	cmd := w.command(PodExec{Binds: []Bind{{Src: src, Dst: dst, ReadOnly: true}}, User: user}, prog, args)
	cmd.Env = append(img.Env(), "TOKEN="+filepath.Join(dst, "token"), "FORBIDDEN="+filepath.Join(t.TempDir(), "x"))
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	for _, want := range []string{"uid=65532 gid=65532 groups=[2000]", "capeff=0000000000000000", "token=tok-123", "write: permission denied"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("the container's output lacks %q:\n%s", want, out)
		}
	}
}

// makeSearchable opens dir and its parents up to the temporary directory for other users
// (t.TempDir makes them 0700).
func makeSearchable(t *testing.T, dir string) {
	t.Helper()
	for ; dir != os.TempDir() && dir != "/"; dir = filepath.Dir(dir) {
		if err := os.Chmod(dir, 0o755); err != nil {
			t.Fatal(err)
		}
	}
}

// TestBuiltImage runs the image `make image` built, the way the lab's nodes run it: make
// image-check sets ILB_IMAGE_LAYOUT (bin/image/oci) and ILB_IMAGE_VERSION. It unpacks the
// image for this machine's platform and runs `ironlb --version` from it as the chart's
// controller user (through pod-exec as root; directly otherwise).
func TestBuiltImage(t *testing.T) {
	layout, version := os.Getenv("ILB_IMAGE_LAYOUT"), os.Getenv("ILB_IMAGE_VERSION")
	if layout == "" || version == "" {
		t.Skip("skipping: ILB_IMAGE_LAYOUT and ILB_IMAGE_VERSION are not set (make image-check sets them)")
	}
	img, err := ociTable(t, layout).Lookup("ghcr.io/ironlb/ironlb:" + version)
	if err != nil {
		t.Fatal(err)
	}
	if uid, gid, err := img.OCI.user(img.OCI.Config.User); err != nil || uid != 65532 || gid != 65532 {
		t.Errorf("image user %q = %d:%d, %v; want 65532:65532", img.OCI.Config.User, uid, gid, err)
	}
	c := &corev1.Container{Name: "controller", Args: []string{"--version"}}
	pod := &corev1.Pod{Spec: corev1.PodSpec{HostNetwork: true, SecurityContext: &corev1.PodSecurityContext{
		RunAsNonRoot: ptr.To(true), RunAsUser: ptr.To[int64](65534), FSGroup: ptr.To[int64](65534)}}}
	env := map[string]string{}
	for _, kv := range img.Env() {
		k, v, _ := strings.Cut(kv, "=")
		env[k] = v
	}
	prog, args, err := img.Resolve(c, env)
	if err != nil {
		t.Fatal(err)
	}
	user, err := containerCred(pod, c, img)
	if err != nil {
		t.Fatal(err)
	}
	var cmd *exec.Cmd
	if os.Geteuid() == 0 {
		makeSearchable(t, filepath.Dir(img.OCI.Rootfs))
		self, err := os.Executable()
		if err != nil {
			t.Fatal(err)
		}
		w := &podWorker{a: &Agent{cfg: Config{Self: self}}, pod: pod}
		cmd = w.command(PodExec{User: user}, prog, args)
	} else {
		cmd = exec.Command(prog, args...)
	}
	cmd.Env = img.Env()
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.HasPrefix(string(out), "ironlb version "+version+", commit ") {
		t.Errorf("%s %q as %v: %v\n%s", prog, args, user, err, out)
	}
	t.Logf("%s (imageID %s, user %v)", strings.TrimSpace(string(out)), img.ID(prog), user)
}
