package agent

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr/funcr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/remotecommand"
	utilexec "k8s.io/client-go/util/exec"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
)

// TestAgentWithAPIServer runs the agent against a real API server (envtest
// with the repository's bin/etcd and bin/kube-apiserver): node registration
// and lease, a whoami pod in its own namespace with env from a Secret and the
// downward API, an exec readiness probe that also checks the mounted
// service-account token, kubectl-logs style access, an unknown image, and
// graceful deletion.
func TestAgentWithAPIServer(t *testing.T) {
	requireRoot(t)
	_, file, _, _ := runtime.Caller(0)
	binDir := filepath.Join(filepath.Dir(file), "..", "..", "..", "bin")
	for _, b := range []string{"etcd", "kube-apiserver"} {
		if _, err := os.Stat(filepath.Join(binDir, b)); err != nil {
			t.Skipf("skipping: %s not built yet (make tools): %v", b, err)
		}
	}
	env := &envtest.Environment{BinaryAssetsDirectory: binDir}
	restCfg, err := env.Start()
	if err != nil {
		t.Fatalf("starting envtest: %v", err)
	}
	t.Cleanup(func() {
		if err := env.Stop(); err != nil {
			t.Logf("stopping envtest: %v", err)
		}
	})
	client := kubernetes.NewForConfigOrDie(restCfg)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	nodeNS := fmt.Sprintf("ilb-t%d-node", os.Getpid())
	if err := runIP(ctx, "netns", "add", nodeNS); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := runIP(context.Background(), "netns", "del", nodeNS); err != nil {
			t.Logf("deleting netns %s: %v", nodeNS, err)
		}
	})
	for _, args := range [][]string{{"link", "set", "lo", "up"}, {"addr", "add", "192.0.2.1/32", "dev", "lo"}} {
		if err := runIP(ctx, append([]string{"-n", nodeNS}, args...)...); err != nil {
			t.Fatal(err)
		}
	}

	self, _ := os.Executable()
	dir := t.TempDir()
	// The agent unpacks images under its state dir; their programs must be reachable for
	// a container's non-root user, as under the lab's .lab.
	makeSearchable(t, dir)
	// An OCI image whose entrypoint is this test binary playing whoami (the role comes
	// from the image's environment).
	bin, err := os.ReadFile(self)
	if err != nil {
		t.Fatal(err)
	}
	l := newTestLayout(t)
	l.plain = true
	idxDigest := l.image(OCIConfig{Entrypoint: []string{"/whoami"}, User: "nonroot", Env: []string{"ILB_AGENT_TEST_ROLE=whoami"}},
		l.layer(tarFile{name: "etc/passwd", data: testPasswd}, tarFile{name: "whoami", data: string(bin), mode: 0o755}))
	table, _ := json.Marshal(ImageTable{Images: map[string]ImageEntry{
		"traefik/whoami":        {Program: self},
		"ghcr.io/ironlb/ironlb": {Layout: l.dir},
	}})
	imagesPath := filepath.Join(dir, "images.json")
	if err := os.WriteFile(imagesPath, table, 0o644); err != nil {
		t.Fatal(err)
	}
	port := freePort(t)
	var a *Agent
	var stopAgent context.CancelFunc
	var agentDone chan error
	startAgent := func() {
		var err error
		a, err = New(Config{
			NodeName: "ilb-test-node", NodeIP: "192.0.2.1", PodCIDR: netip.MustParsePrefix("10.244.78.0/24"),
			RestConfig: restCfg, StateDir: filepath.Join(dir, "state"), NetNS: nodeNS, Images: imagesPath,
			KubeletPort: port, Self: self,
			Log: funcr.New(func(prefix, args string) { t.Log(prefix, args) }, funcr.Options{}),
		})
		if err != nil {
			t.Fatal(err)
		}
		var agentCtx context.Context
		agentCtx, stopAgent = context.WithCancel(ctx)
		agentDone = make(chan error, 1)
		go func() { agentDone <- a.Run(agentCtx) }()
	}
	startAgent()
	t.Cleanup(func() {
		stopAgent()
		if err := <-agentDone; err != nil {
			t.Logf("agent Run: %v", err)
		}
		// Pods the test did not delete: remove their namespaces.
		for _, k := range a.ipam.Keys() {
			a.net.Teardown(context.Background(), types.UID(k))
		}
	})

	// poll waits for cond; on timeout it reports the pods' states, which
	// together with the agent's log (t.Log) explain what did not happen.
	poll := func(what string, cond func() (bool, error)) {
		t.Helper()
		err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 90*time.Second, true, func(context.Context) (bool, error) { return cond() })
		if err != nil {
			var states []string
			if pods, lerr := client.CoreV1().Pods("").List(context.Background(), metav1.ListOptions{}); lerr == nil {
				for _, p := range pods.Items {
					b, _ := json.Marshal(p.Status)
					states = append(states, p.Name+": "+string(b))
				}
			}
			t.Fatalf("waiting for %s: %v\npods:\n%s", what, err, strings.Join(states, "\n"))
		}
	}
	poll("node Ready", func() (bool, error) {
		n, err := client.CoreV1().Nodes().Get(ctx, "ilb-test-node", metav1.GetOptions{})
		if err != nil {
			return false, nil //nolint:nilerr // not there yet: keep polling
		}
		for _, c := range n.Status.Conditions {
			if c.Type == corev1.NodeReady && c.Status == corev1.ConditionTrue {
				return n.Spec.PodCIDR == "10.244.78.0/24" && n.Status.DaemonEndpoints.KubeletEndpoint.Port == int32(port), nil
			}
		}
		return false, nil
	})
	poll("node lease", func() (bool, error) {
		_, err := client.CoordinationV1().Leases("kube-node-lease").Get(ctx, "ilb-test-node", metav1.GetOptions{})
		return err == nil, nil
	})

	ns := "default"
	if _, err := client.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	if _, err := client.CoreV1().Secrets(ns).Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "memberlist"}, StringData: map[string]string{"secretkey": "s3cret"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "whoami-1"},
		Spec: corev1.PodSpec{
			NodeName:                      "ilb-test-node",
			TerminationGracePeriodSeconds: ptr.To[int64](5),
			Containers: []corev1.Container{{
				Name: "whoami", Image: "docker.io/traefik/whoami:v1.10",
				Env: []corev1.EnvVar{
					{Name: "ILB_AGENT_TEST_ROLE", Value: "whoami"},
					{Name: "KEY", ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: "memberlist"}, Key: "secretkey"}}},
					{Name: "MY_IP", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "status.podIP"}}},
				},
				ReadinessProbe: &corev1.Probe{
					PeriodSeconds: 1,
					ProbeHandler: corev1.ProbeHandler{Exec: &corev1.ExecAction{Command: []string{"sh", "-c",
						`test -s /var/run/secrets/kubernetes.io/serviceaccount/token && test "$KEY" = s3cret && test -n "$MY_IP" && curl -sf --noproxy '*' http://127.0.0.1:8080/health`}}},
				},
			}},
		},
	}
	if _, err := client.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var got *corev1.Pod
	poll("whoami pod Running and Ready", func() (bool, error) {
		p, err := client.CoreV1().Pods(ns).Get(ctx, "whoami-1", metav1.GetOptions{})
		if err != nil {
			return false, nil //nolint:nilerr // not there yet: keep polling
		}
		got = p
		return p.Status.Phase == corev1.PodRunning && podReady(p), nil
	})
	// The node lifecycle controller marks a pod not Ready when its node's
	// lease went stale (the API server away for longer than the grace
	// period); the agent, as the kubelet, sets it right again.
	notReady := got.DeepCopy()
	for i, c := range notReady.Status.Conditions {
		if c.Type == corev1.PodReady {
			notReady.Status.Conditions[i].Status, notReady.Status.Conditions[i].Reason = corev1.ConditionFalse, "NodeNotReady"
		}
	}
	if _, err := client.CoreV1().Pods(ns).UpdateStatus(ctx, notReady, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	poll("whoami pod Ready again after another component marked it not Ready", func() (bool, error) {
		p, err := client.CoreV1().Pods(ns).Get(ctx, "whoami-1", metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		return podReady(p), nil
	})
	if got.Status.PodIP != "10.244.78.2" || got.Status.HostIP != "192.0.2.1" {
		t.Errorf("pod addresses: podIP=%s hostIP=%s", got.Status.PodIP, got.Status.HostIP)
	}
	cs := got.Status.ContainerStatuses
	if len(cs) != 1 || !cs[0].Ready || cs[0].State.Running == nil || cs[0].Started == nil || !*cs[0].Started {
		t.Errorf("container status: %+v", cs)
	}
	out, err := exec.CommandContext(ctx, "ip", "netns", "exec", nodeNS, "curl", "-sS", "--noproxy", "*", "--max-time", "5", "http://10.244.78.2:8080/").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "Hostname: whoami-1") {
		t.Errorf("curl the pod from its node: %v\n%s", err, out)
	}

	// The kubelet endpoint serves the container's log file.
	if err := os.WriteFile(a.containerLogPath(ns, "whoami-1", "whoami"), []byte("hello from the log\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}, Proxy: nil}}
	resp, err := hc.Get(fmt.Sprintf("https://127.0.0.1:%d/containerLogs/%s/whoami-1/whoami", port, ns))
	if err != nil {
		t.Errorf("kubelet endpoint: %v", err)
	} else {
		b, _ := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		if !strings.Contains(string(b), "hello from the log") {
			t.Errorf("containerLogs answer: %d %q", resp.StatusCode, b)
		}
	}

	// The kubelet exec endpoint (kubectl exec through the API server).
	execIn := func(stdin string, command ...string) (string, error) {
		u, _ := url.Parse(fmt.Sprintf("https://127.0.0.1:%d/exec/%s/whoami-1/whoami?output=1&error=1", port, ns))
		q := u.Query()
		for _, c := range command {
			q.Add("command", c)
		}
		if stdin != "" {
			q.Set("input", "1")
		}
		u.RawQuery = q.Encode()
		ex, err := remotecommand.NewSPDYExecutor(&rest.Config{Host: u.Host, TLSClientConfig: rest.TLSClientConfig{Insecure: true}}, "POST", u)
		if err != nil {
			return "", err
		}
		// Separate buffers: the two streams arrive independently, so a shared one
		// would interleave them in any order.
		var out, errOut strings.Builder
		opts := remotecommand.StreamOptions{Stdout: &out, Stderr: &errOut}
		if stdin != "" {
			opts.Stdin = strings.NewReader(stdin)
		}
		err = ex.StreamWithContext(ctx, opts)
		return out.String() + errOut.String(), err
	}
	if out, err := execIn("", "sh", "-c", "hostname; echo $KEY; ip -o -4 addr show dev eth0 | grep -c 10.244.78.2; echo oops >&2"); err != nil || out != "whoami-1\ns3cret\n1\noops\n" {
		t.Errorf("exec in the container: %q %v", out, err)
	}
	if out, err := execIn("hello\n", "cat"); err != nil || out != "hello\n" {
		t.Errorf("exec with stdin: %q %v", out, err)
	}
	var ce utilexec.CodeExitError
	if _, err := execIn("", "sh", "-c", "exit 7"); !errors.As(err, &ce) || ce.Code != 7 {
		t.Errorf("exec exit code: %v, want exit code 7", err)
	}

	// An image the lab does not have: Pending with a clear reason.
	bad := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "nginx-1"}, Spec: corev1.PodSpec{
		NodeName: "ilb-test-node", Containers: []corev1.Container{{Name: "nginx", Image: "nginx:1.27"}}}}
	if _, err := client.CoreV1().Pods(ns).Create(ctx, bad, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	poll("nginx pod waiting with an image pull error", func() (bool, error) {
		p, err := client.CoreV1().Pods(ns).Get(ctx, "nginx-1", metav1.GetOptions{})
		if err != nil || len(p.Status.ContainerStatuses) != 1 {
			return false, nil //nolint:nilerr // not there yet: keep polling
		}
		w := p.Status.ContainerStatuses[0].State.Waiting
		return p.Status.Phase == corev1.PodPending && w != nil &&
			(w.Reason == "ErrImagePull" || w.Reason == "ImagePullBackOff") &&
			strings.Contains(w.Message, "image nginx:1.27 is not in the lab's image table (known: ghcr.io/ironlb/ironlb, traefik/whoami)"), nil
	})

	// A pod from the OCI image: the image's entrypoint and environment, the pod's user
	// (as the chart's controller: runAsNonRoot, runAsUser 65534, fsGroup), the image's
	// digest as imageID.
	ociPod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "from-image"}, Spec: corev1.PodSpec{
		NodeName: "ilb-test-node", TerminationGracePeriodSeconds: ptr.To[int64](1),
		SecurityContext: &corev1.PodSecurityContext{RunAsNonRoot: ptr.To(true), RunAsUser: ptr.To[int64](65534), FSGroup: ptr.To[int64](65534)},
		Containers:      []corev1.Container{{Name: "c", Image: "ghcr.io/ironlb/ironlb:0.1.0"}}}}
	if _, err := client.CoreV1().Pods(ns).Create(ctx, ociPod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var ociStatus corev1.ContainerStatus
	poll("the pod from the OCI image Running", func() (bool, error) {
		p, err := client.CoreV1().Pods(ns).Get(ctx, "from-image", metav1.GetOptions{})
		if err != nil || p.Status.Phase != corev1.PodRunning || len(p.Status.ContainerStatuses) != 1 {
			return false, nil //nolint:nilerr // not there yet: keep polling
		}
		ociStatus = p.Status.ContainerStatuses[0]
		return true, nil
	})
	if want := "ghcr.io/ironlb/ironlb@" + idxDigest; ociStatus.ImageID != want {
		t.Errorf("imageID %q, want %q", ociStatus.ImageID, want)
	}
	poll("the image's whoami answering", func() (bool, error) {
		p, err := client.CoreV1().Pods(ns).Get(ctx, "from-image", metav1.GetOptions{})
		if err != nil || p.Status.PodIP == "" {
			return false, nil //nolint:nilerr // not there yet: keep polling
		}
		out, err := exec.CommandContext(ctx, "ip", "netns", "exec", nodeNS, "curl", "-sS", "--noproxy", "*", "--max-time", "2", "http://"+p.Status.PodIP+":8080/").CombinedOutput()
		return err == nil && strings.Contains(string(out), "Hostname: from-image"), nil
	})
	// It answers, so pod-exec has switched users and exec'd the image's program.
	status, err := os.ReadFile("/proc/" + strings.TrimPrefix(ociStatus.ContainerID, "lab://") + "/status")
	if err != nil || !regexp.MustCompile(`(?m)^Uid:\s+65534\s`).Match(status) || !regexp.MustCompile(`(?m)^Groups:\s+65534\s*$`).Match(status) {
		t.Errorf("the container's process: want uid 65534 and groups 65534; %v\n%s", err, status)
	}
	if err := client.CoreV1().Pods(ns).Delete(ctx, "from-image", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}

	// A hostNetwork pod runs in the node's namespace with the node's address.
	hostPod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "hostnet"}, Spec: corev1.PodSpec{
		NodeName: "ilb-test-node", HostNetwork: true, TerminationGracePeriodSeconds: ptr.To[int64](2),
		Containers: []corev1.Container{{Name: "whoami", Image: "traefik/whoami",
			Env: []corev1.EnvVar{{Name: "ILB_AGENT_TEST_ROLE", Value: "whoami"}}}}}}
	if _, err := client.CoreV1().Pods(ns).Create(ctx, hostPod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	poll("hostNetwork pod Running with the node IP", func() (bool, error) {
		p, err := client.CoreV1().Pods(ns).Get(ctx, "hostnet", metav1.GetOptions{})
		return err == nil && p.Status.Phase == corev1.PodRunning && podReady(p) && p.Status.PodIP == "192.0.2.1", nil
	})
	poll("hostNetwork whoami answering on the node address", func() (bool, error) {
		out, err := exec.CommandContext(ctx, "ip", "netns", "exec", nodeNS, "curl", "-sS", "--noproxy", "*", "--max-time", "2", "http://192.0.2.1:8080/").CombinedOutput()
		return err == nil && strings.Contains(string(out), "Hostname: ilb-test-node"), nil
	})
	if err := client.CoreV1().Pods(ns).Delete(ctx, "hostnet", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	poll("hostNetwork pod gone", func() (bool, error) {
		_, err := client.CoreV1().Pods(ns).Get(ctx, "hostnet", metav1.GetOptions{})
		return apierrors.IsNotFound(err), nil
	})

	// An init container fills an emptyDir the main container checks in its
	// readiness probe; a failing liveness probe restarts the main container.
	initPod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "init-live"}, Spec: corev1.PodSpec{
		NodeName: "ilb-test-node", TerminationGracePeriodSeconds: ptr.To[int64](1),
		Volumes: []corev1.Volume{{Name: "data", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}},
		InitContainers: []corev1.Container{{Name: "init", Image: "traefik/whoami", Command: []string{"sh", "-c", "echo ok > /ilb-test-data/init-done"},
			VolumeMounts: []corev1.VolumeMount{{Name: "data", MountPath: "/ilb-test-data"}}}},
		Containers: []corev1.Container{{Name: "main", Image: "traefik/whoami", Command: []string{"sleep", "600"},
			VolumeMounts:   []corev1.VolumeMount{{Name: "data", MountPath: "/ilb-test-data", ReadOnly: true}},
			ReadinessProbe: &corev1.Probe{PeriodSeconds: 1, ProbeHandler: corev1.ProbeHandler{Exec: &corev1.ExecAction{Command: []string{"test", "-f", "/ilb-test-data/init-done"}}}},
			LivenessProbe: &corev1.Probe{PeriodSeconds: 1, FailureThreshold: 2, InitialDelaySeconds: 2,
				ProbeHandler: corev1.ProbeHandler{Exec: &corev1.ExecAction{Command: []string{"false"}}}},
		}}}}
	if _, err := client.CoreV1().Pods(ns).Create(ctx, initPod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	sawReady := false
	poll("init container done, main Ready, then restarted by its liveness probe", func() (bool, error) {
		p, err := client.CoreV1().Pods(ns).Get(ctx, "init-live", metav1.GetOptions{})
		if err != nil || len(p.Status.ContainerStatuses) != 1 || len(p.Status.InitContainerStatuses) != 1 {
			return false, nil //nolint:nilerr // not there yet: keep polling
		}
		if it := p.Status.InitContainerStatuses[0].State.Terminated; it == nil || it.ExitCode != 0 {
			return false, nil
		}
		sawReady = sawReady || podReady(p)
		cs := p.Status.ContainerStatuses[0]
		last := cs.LastTerminationState.Terminated
		return sawReady && cs.RestartCount >= 1 && last != nil && strings.Contains(last.Message, "Liveness probe failed"), nil
	})
	if err := client.CoreV1().Pods(ns).Delete(ctx, "init-live", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}

	// A Secret update reaches the running pod's secret volume.
	sec, err := client.CoreV1().Secrets(ns).Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "certs"}, StringData: map[string]string{"tls.crt": "v1"}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	secPod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "secvol"}, Spec: corev1.PodSpec{
		NodeName: "ilb-test-node", TerminationGracePeriodSeconds: ptr.To[int64](1),
		Volumes: []corev1.Volume{{Name: "certs", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: "certs"}}}},
		Containers: []corev1.Container{{Name: "main", Image: "traefik/whoami", Command: []string{"sleep", "600"},
			VolumeMounts:   []corev1.VolumeMount{{Name: "certs", MountPath: "/ilb-test-certs", ReadOnly: true}},
			ReadinessProbe: &corev1.Probe{PeriodSeconds: 1, ProbeHandler: corev1.ProbeHandler{Exec: &corev1.ExecAction{Command: []string{"grep", "-q", "v2", "/ilb-test-certs/tls.crt"}}}},
		}}}}
	created, err := client.CoreV1().Pods(ns).Create(ctx, secPod, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	poll("secret pod Running (not Ready: the volume holds v1)", func() (bool, error) {
		p, err := client.CoreV1().Pods(ns).Get(ctx, "secvol", metav1.GetOptions{})
		return err == nil && p.Status.Phase == corev1.PodRunning && !podReady(p), nil
	})
	sec.StringData = map[string]string{"tls.crt": "v2"}
	if _, err := client.CoreV1().Secrets(ns).Update(ctx, sec, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	poll("secret update seen inside the container (pod Ready)", func() (bool, error) {
		p, err := client.CoreV1().Pods(ns).Get(ctx, "secvol", metav1.GetOptions{})
		return err == nil && podReady(p), nil
	})
	if b, _ := os.ReadFile(filepath.Join(a.podDir(created.UID), "volumes", "certs", "tls.crt")); string(b) != "v2" {
		t.Errorf("secret volume on the host holds %q, want v2", b)
	}
	if err := client.CoreV1().Pods(ns).Delete(ctx, "secvol", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}

	// Restart policies: Never keeps a failed container terminated, OnFailure
	// does not restart a successful one.
	for name, tc := range map[string]struct {
		policy corev1.RestartPolicy
		script string
		phase  corev1.PodPhase
		code   int32
	}{
		"fail-never":   {corev1.RestartPolicyNever, "exit 3", corev1.PodFailed, 3},
		"ok-onfailure": {corev1.RestartPolicyOnFailure, "exit 0", corev1.PodSucceeded, 0},
	} {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: corev1.PodSpec{
			NodeName: "ilb-test-node", RestartPolicy: tc.policy,
			Containers: []corev1.Container{{Name: "c", Image: "traefik/whoami", Command: []string{"sh", "-c", tc.script}}}}}
		if _, err := client.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		poll(name+" pod "+string(tc.phase), func() (bool, error) {
			p, err := client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
			if err != nil || p.Status.Phase != tc.phase || len(p.Status.ContainerStatuses) != 1 {
				return false, nil //nolint:nilerr // not there yet: keep polling
			}
			term := p.Status.ContainerStatuses[0].State.Terminated
			return term != nil && term.ExitCode == tc.code && p.Status.ContainerStatuses[0].RestartCount == 0, nil
		})
		if err := client.CoreV1().Pods(ns).Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}

	// An agent restart keeps the pod's address and runs it again.
	stopAgent()
	if err := <-agentDone; err != nil {
		t.Fatalf("agent Run: %v", err)
	}
	startAgent()
	poll("whoami pod Ready again after an agent restart", func() (bool, error) {
		p, err := client.CoreV1().Pods(ns).Get(ctx, "whoami-1", metav1.GetOptions{})
		if err != nil || len(p.Status.ContainerStatuses) != 1 {
			return false, nil //nolint:nilerr // not there yet: keep polling
		}
		cs := p.Status.ContainerStatuses[0]
		return podReady(p) && cs.RestartCount == 1 && cs.State.Running != nil && p.Status.PodIP == "10.244.78.2", nil
	})
	out, err = exec.CommandContext(ctx, "ip", "netns", "exec", nodeNS, "curl", "-sS", "--noproxy", "*", "--max-time", "5", "http://10.244.78.2:8080/").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "Hostname: whoami-1") {
		t.Errorf("curl the pod after the agent restart: %v\n%s", err, out)
	}

	// Graceful deletion: the agent stops the process, frees the network and deletes the object.
	podNS, _ := PodNetNames(got.UID)
	if err := client.CoreV1().Pods(ns).Delete(ctx, "whoami-1", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	poll("whoami pod gone", func() (bool, error) {
		_, err := client.CoreV1().Pods(ns).Get(ctx, "whoami-1", metav1.GetOptions{})
		return apierrors.IsNotFound(err), nil
	})
	if NetnsExists(podNS) {
		t.Errorf("pod namespace %s left behind", podNS)
	}
	if _, ok := a.ipam.Lookup(string(got.UID)); ok {
		t.Errorf("pod address not released")
	}
	if err := client.CoreV1().Pods(ns).Delete(ctx, "nginx-1", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	poll("nginx pod gone", func() (bool, error) {
		_, err := client.CoreV1().Pods(ns).Get(ctx, "nginx-1", metav1.GetOptions{})
		return apierrors.IsNotFound(err), nil
	})
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

func freePort(t *testing.T) int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = l.Close() }()
	return l.Addr().(*net.TCPAddr).Port
}
