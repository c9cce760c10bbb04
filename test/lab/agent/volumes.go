package agent

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

const (
	saMountPath     = "/var/run/secrets/kubernetes.io/serviceaccount"
	saVolumeName    = "ilb-kube-api-access"
	volumeRefresh   = 10 * time.Second
	defaultFileMode = 0o644
)

type cachedToken struct {
	token           string
	issued, expires time.Time
}

// volumes returns the pod's volumes plus the service-account volume the
// agent adds itself when the pod should have a token but the API server's
// ServiceAccount admission did not add one.
func (w *podWorker) volumes() []corev1.Volume {
	pod := w.latest()
	vols := append([]corev1.Volume{}, pod.Spec.Volumes...)
	if w.needsSAVolume(pod) {
		vols = append(vols, corev1.Volume{Name: saVolumeName, VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{
			DefaultMode: ptr.To[int32](defaultFileMode),
			Sources: []corev1.VolumeProjection{
				{ServiceAccountToken: &corev1.ServiceAccountTokenProjection{Path: "token", ExpirationSeconds: ptr.To[int64](3607)}},
				{ConfigMap: &corev1.ConfigMapProjection{LocalObjectReference: corev1.LocalObjectReference{Name: "kube-root-ca.crt"}, Items: []corev1.KeyToPath{{Key: "ca.crt", Path: "ca.crt"}}}},
				{DownwardAPI: &corev1.DownwardAPIProjection{Items: []corev1.DownwardAPIVolumeFile{{Path: "namespace", FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.namespace"}}}}},
			},
		}}})
	}
	return vols
}

func (w *podWorker) needsSAVolume(pod *corev1.Pod) bool {
	if pod.Spec.AutomountServiceAccountToken != nil && !*pod.Spec.AutomountServiceAccountToken {
		return false
	}
	for _, c := range append(append([]corev1.Container{}, pod.Spec.InitContainers...), pod.Spec.Containers...) {
		for _, m := range c.VolumeMounts {
			if filepath.Clean(m.MountPath) == saMountPath {
				return false
			}
		}
	}
	return true
}

func (w *podWorker) volumeDir(name string) string {
	return filepath.Join(w.dir, "volumes", name)
}

// bindsFor returns the bind mounts of container c.
func (w *podWorker) bindsFor(c *corev1.Container, env map[string]string) ([]Bind, error) {
	src := map[string]string{}
	for _, v := range w.volumes() {
		if v.HostPath != nil {
			src[v.Name] = v.HostPath.Path
		} else {
			src[v.Name] = w.volumeDir(v.Name)
		}
	}
	var binds []Bind
	for _, m := range c.VolumeMounts {
		s, ok := src[m.Name]
		if !ok {
			return nil, fmt.Errorf("volumeMount %s: no volume of that name", m.Name)
		}
		sub := m.SubPath
		if m.SubPathExpr != "" {
			sub = Expand(m.SubPathExpr, env)
		}
		if sub != "" {
			if filepath.IsAbs(sub) || strings.HasPrefix(filepath.Clean(sub), "..") {
				return nil, fmt.Errorf("volumeMount %s: subPath %q must be a relative path inside the volume", m.Name, sub)
			}
			s = filepath.Join(s, sub)
			if _, err := os.Stat(s); errors.Is(err, os.ErrNotExist) {
				if err := os.MkdirAll(s, 0o755); err != nil {
					return nil, fmt.Errorf("volumeMount %s: subPath: %w", m.Name, err)
				}
			}
		}
		binds = append(binds, Bind{Src: s, Dst: m.MountPath, ReadOnly: m.ReadOnly})
	}
	if w.needsSAVolume(w.latest()) {
		binds = append(binds, Bind{Src: w.volumeDir(saVolumeName), Dst: saMountPath, ReadOnly: true})
	}
	return binds, nil
}

// refreshVolumes rewrites secret, configMap, downwardAPI and projected
// volumes periodically, as the kubelet does: updated Secrets (webhook
// certificates!) and refreshed service-account tokens reach running pods.
func (w *podWorker) refreshVolumes(ctx context.Context) {
	t := time.NewTicker(volumeRefresh)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if err := w.materializeVolumes(ctx); err != nil && ctx.Err() == nil {
			w.log.Error(err, "Refreshing volumes failed")
		}
	}
}

// materializeVolumes writes every volume's content into the pod's state dir.
func (w *podWorker) materializeVolumes(ctx context.Context) error {
	for _, v := range w.volumes() {
		if err := w.materializeVolume(ctx, v); err != nil {
			return fmt.Errorf("volume %s: %w", v.Name, err)
		}
	}
	return nil
}

type volFile struct {
	data []byte
	mode os.FileMode
}

func (w *podWorker) materializeVolume(ctx context.Context, v corev1.Volume) error {
	dir := w.volumeDir(v.Name)
	pod := w.podForEnv()
	files := map[string]volFile{}
	switch {
	case v.EmptyDir != nil:
		// Writable by every user, as the kubelet makes it (MkdirAll is subject to the umask).
		if err := os.MkdirAll(dir, 0o777); err != nil {
			return err
		}
		return os.Chmod(dir, 0o777)
	case v.HostPath != nil:
		t := corev1.HostPathUnset
		if v.HostPath.Type != nil {
			t = *v.HostPath.Type
		}
		switch t {
		case corev1.HostPathDirectoryOrCreate:
			return os.MkdirAll(v.HostPath.Path, 0o755)
		case corev1.HostPathFileOrCreate:
			f, err := os.OpenFile(v.HostPath.Path, os.O_CREATE|os.O_WRONLY, 0o644)
			if err != nil {
				return err
			}
			return f.Close()
		}
		if _, err := os.Stat(v.HostPath.Path); err != nil && t != corev1.HostPathUnset {
			return fmt.Errorf("hostPath: %w", err)
		}
		return nil
	case v.Secret != nil:
		if err := w.secretFiles(ctx, files, v.Secret.SecretName, v.Secret.Items, v.Secret.Optional, modeOr(v.Secret.DefaultMode)); err != nil {
			return err
		}
	case v.ConfigMap != nil:
		if err := w.configMapFiles(ctx, files, v.ConfigMap.Name, v.ConfigMap.Items, v.ConfigMap.Optional, modeOr(v.ConfigMap.DefaultMode)); err != nil {
			return err
		}
	case v.DownwardAPI != nil:
		if err := w.downwardFiles(files, pod, v.DownwardAPI.Items, modeOr(v.DownwardAPI.DefaultMode)); err != nil {
			return err
		}
	case v.Projected != nil:
		mode := modeOr(v.Projected.DefaultMode)
		for _, s := range v.Projected.Sources {
			var err error
			switch {
			case s.Secret != nil:
				err = w.secretFiles(ctx, files, s.Secret.Name, s.Secret.Items, s.Secret.Optional, mode)
			case s.ConfigMap != nil:
				err = w.configMapFiles(ctx, files, s.ConfigMap.Name, s.ConfigMap.Items, s.ConfigMap.Optional, mode)
			case s.DownwardAPI != nil:
				err = w.downwardFiles(files, pod, s.DownwardAPI.Items, mode)
			case s.ServiceAccountToken != nil:
				var tok string
				tok, err = w.token(ctx, pod, s.ServiceAccountToken)
				files[s.ServiceAccountToken.Path] = volFile{data: []byte(tok), mode: mode}
			default:
				err = errors.New("projected source not supported by the lab agent (supported: secret, configMap, downwardAPI, serviceAccountToken)")
			}
			if err != nil {
				return err
			}
		}
	default:
		return errors.New("volume type not supported by the lab agent (supported: emptyDir, hostPath, secret, configMap, downwardAPI, projected)")
	}
	return writeVolume(dir, files)
}

func modeOr(m *int32) os.FileMode {
	if m == nil {
		return defaultFileMode
	}
	return os.FileMode(*m)
}

func (w *podWorker) secretFiles(ctx context.Context, files map[string]volFile, name string, items []corev1.KeyToPath, optional *bool, mode os.FileMode) error {
	s, err := w.a.Secret(ctx, w.latest().Namespace, name)
	if err != nil {
		if apierrors.IsNotFound(err) && isTrue(optional) {
			return nil
		}
		return fmt.Errorf("secret %q: %w", name, err)
	}
	return keyFiles(files, "Secret", name, s.Data, items, optional, mode)
}

func (w *podWorker) configMapFiles(ctx context.Context, files map[string]volFile, name string, items []corev1.KeyToPath, optional *bool, mode os.FileMode) error {
	cm, err := w.a.ConfigMap(ctx, w.latest().Namespace, name)
	if err != nil {
		if apierrors.IsNotFound(err) && isTrue(optional) {
			return nil
		}
		return fmt.Errorf("configmap %q: %w", name, err)
	}
	data := map[string][]byte{}
	for k, v := range cm.BinaryData {
		data[k] = v
	}
	for k, v := range cm.Data {
		data[k] = []byte(v)
	}
	return keyFiles(files, "ConfigMap", name, data, items, optional, mode)
}

func keyFiles(files map[string]volFile, kind, name string, data map[string][]byte, items []corev1.KeyToPath, optional *bool, mode os.FileMode) error {
	if len(items) == 0 {
		for k, v := range data {
			files[k] = volFile{data: v, mode: mode}
		}
		return nil
	}
	for _, it := range items {
		v, ok := data[it.Key]
		if !ok {
			if isTrue(optional) {
				continue
			}
			return fmt.Errorf("couldn't find key %s in %s %s", it.Key, kind, name)
		}
		m := mode
		if it.Mode != nil {
			m = os.FileMode(*it.Mode)
		}
		files[it.Path] = volFile{data: v, mode: m}
	}
	return nil
}

func (w *podWorker) downwardFiles(files map[string]volFile, pod *corev1.Pod, items []corev1.DownwardAPIVolumeFile, mode os.FileMode) error {
	for _, it := range items {
		var val string
		var err error
		switch {
		case it.FieldRef != nil:
			val, err = FieldValue(pod, it.FieldRef.FieldPath)
		case it.ResourceFieldRef != nil:
			var c *corev1.Container
			for i := range pod.Spec.Containers {
				if pod.Spec.Containers[i].Name == it.ResourceFieldRef.ContainerName {
					c = &pod.Spec.Containers[i]
				}
			}
			if c == nil {
				return fmt.Errorf("downwardAPI %s: no container %q", it.Path, it.ResourceFieldRef.ContainerName)
			}
			val, err = resourceValue(c, it.ResourceFieldRef, w.a.nodeAllocatable())
		}
		if err != nil {
			return fmt.Errorf("downwardAPI %s: %w", it.Path, err)
		}
		m := mode
		if it.Mode != nil {
			m = os.FileMode(*it.Mode)
		}
		files[it.Path] = volFile{data: []byte(val), mode: m}
	}
	return nil
}

// token returns a bound service-account token for the pod, requesting a new
// one when 80% of the current one's lifetime has passed (as the kubelet does).
func (w *podWorker) token(ctx context.Context, pod *corev1.Pod, p *corev1.ServiceAccountTokenProjection) (string, error) {
	exp := int64(3600)
	if p.ExpirationSeconds != nil {
		exp = *p.ExpirationSeconds
	}
	sa := pod.Spec.ServiceAccountName
	if sa == "" {
		sa = "default"
	}
	key := fmt.Sprintf("%s|%s|%d", sa, p.Audience, exp)
	w.mu.Lock()
	c, ok := w.tokens[key]
	w.mu.Unlock()
	now := time.Now()
	if ok && now.Before(c.issued.Add(c.expires.Sub(c.issued)*8/10)) {
		return c.token, nil
	}
	req := &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &exp}}
	if pod.Spec.ServiceAccountName != "" {
		// Bound to the pod, as the kubelet's tokens are. The API server only
		// binds to pods whose serviceAccountName names the account, which
		// admission fills in (an API server without the ServiceAccount
		// admission plugin leaves it empty: then the token is unbound).
		req.Spec.BoundObjectRef = &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID}
	}
	if p.Audience != "" {
		req.Spec.Audiences = []string{p.Audience}
	}
	res, err := w.a.client.CoreV1().ServiceAccounts(pod.Namespace).CreateToken(ctx, sa, req, metav1.CreateOptions{})
	if err != nil {
		if ok && now.Before(c.expires) {
			return c.token, nil // keep the valid one, try again next refresh
		}
		return "", fmt.Errorf("requesting a token for service account %s/%s: %w", pod.Namespace, sa, err)
	}
	c = cachedToken{token: res.Status.Token, issued: now, expires: res.Status.ExpirationTimestamp.Time}
	w.mu.Lock()
	w.tokens[key] = c
	w.mu.Unlock()
	return c.token, nil
}

// writeVolume makes dir hold exactly files: changed files are replaced
// atomically (the directory is bind-mounted, so running containers see the
// new content), files no longer wanted are removed.
func writeVolume(dir string, files map[string]volFile) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	for rel, f := range files {
		clean := filepath.Clean(rel)
		if filepath.IsAbs(clean) || strings.HasPrefix(clean, "..") {
			return fmt.Errorf("file path %q escapes the volume", rel)
		}
		p := filepath.Join(dir, clean)
		if old, err := os.ReadFile(p); err == nil && string(old) == string(f.data) {
			if st, err := os.Stat(p); err == nil && st.Mode().Perm() == f.mode.Perm() {
				continue
			}
		}
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return err
		}
		if err := writeFileAtomic(p, f.data, f.mode.Perm()); err != nil {
			return err
		}
	}
	return filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		// Pruning is best effort: an unreadable entry or a failed removal
		// never fails the volume update.
		if err != nil || d.IsDir() {
			return nil //nolint:nilerr // skip the entry, see above
		}
		rel, _ := filepath.Rel(dir, p)
		if _, ok := files[rel]; !ok {
			_ = os.Remove(p)
		}
		return nil
	})
}
