package agent

import (
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

func TestWriteVolume(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "vol")
	if err := writeVolume(dir, map[string]volFile{
		"tls.crt":    {data: []byte("cert-1"), mode: 0o644},
		"tls.key":    {data: []byte("key-1"), mode: 0o600},
		"sub/ca.crt": {data: []byte("ca"), mode: 0o644},
	}); err != nil {
		t.Fatal(err)
	}
	// An update replaces changed files and removes files no longer wanted.
	if err := writeVolume(dir, map[string]volFile{
		"tls.crt": {data: []byte("cert-2"), mode: 0o644},
		"tls.key": {data: []byte("key-1"), mode: 0o600},
	}); err != nil {
		t.Fatal(err)
	}
	read := func(p string) string { b, _ := os.ReadFile(filepath.Join(dir, p)); return string(b) }
	if read("tls.crt") != "cert-2" || read("tls.key") != "key-1" {
		t.Errorf("contents after update: %q %q", read("tls.crt"), read("tls.key"))
	}
	if _, err := os.Stat(filepath.Join(dir, "sub/ca.crt")); !os.IsNotExist(err) {
		t.Errorf("stale file kept: %v", err)
	}
	if st, _ := os.Stat(filepath.Join(dir, "tls.key")); st.Mode().Perm() != 0o600 {
		t.Errorf("tls.key mode %v, want 0600", st.Mode().Perm())
	}
	if err := writeVolume(dir, map[string]volFile{"../escape": {data: []byte("x")}}); err == nil {
		t.Error("a path escaping the volume: want an error")
	}
}

func TestKeyFiles(t *testing.T) {
	data := map[string][]byte{"a": []byte("1"), "b": []byte("2")}
	files := map[string]volFile{}
	mode := int32(0o400)
	if err := keyFiles(files, "Secret", "s", data, []corev1.KeyToPath{{Key: "b", Path: "dir/b.txt", Mode: &mode}}, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if len(files) != 1 || string(files["dir/b.txt"].data) != "2" || files["dir/b.txt"].mode != 0o400 {
		t.Errorf("items projection: %+v", files)
	}
	err := keyFiles(map[string]volFile{}, "Secret", "s", data, []corev1.KeyToPath{{Key: "zz", Path: "zz"}}, nil, 0o644)
	if err == nil || !strings.Contains(err.Error(), "couldn't find key zz in Secret s") {
		t.Errorf("missing key: %v", err)
	}
}

func TestComputeStatus(t *testing.T) {
	a := &Agent{cfg: Config{NodeIP: "172.18.0.3", NodeName: "myk8s-worker"}}
	pod := testPod()
	pod.Status = corev1.PodStatus{Conditions: []corev1.PodCondition{{Type: corev1.PodScheduled, Status: corev1.ConditionTrue}}}
	pod.Spec.Containers = []corev1.Container{{Name: "web", Image: "traefik/whoami"}, {Name: "side", Image: "nginx"}}
	w := newPodWorker(a, pod)
	w.podIPs, w.netReady = []string{"10.10.1.2"}, true
	now := time.Now()
	w.mains[0].status.State = corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: metav1.NewTime(now)}}
	w.mains[0].status.Ready = true
	w.mains[1].status.State = corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "ErrImagePull", Message: "image nginx is not in the lab's image table"}}

	st := w.computeStatus(pod, now)
	if st.Phase != corev1.PodPending {
		t.Errorf("phase with an image that cannot be pulled = %s, want Pending", st.Phase)
	}
	if c := findCondition(st.Conditions, corev1.PodReady); c == nil || c.Status != corev1.ConditionFalse || !strings.Contains(c.Message, "[side]") {
		t.Errorf("Ready condition = %+v", c)
	}
	if c := findCondition(st.Conditions, corev1.PodScheduled); c == nil || c.Status != corev1.ConditionTrue {
		t.Errorf("PodScheduled condition lost: %+v", st.Conditions)
	}
	if st.PodIP != "10.10.1.2" || st.HostIP != "172.18.0.3" || len(st.PodIPs) != 1 {
		t.Errorf("addresses: podIP=%q hostIP=%q podIPs=%v", st.PodIP, st.HostIP, st.PodIPs)
	}

	w.mains[1].status.State = corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: metav1.NewTime(now)}}
	w.mains[1].status.Ready = true
	pod.Status = st
	later := now.Add(time.Minute)
	st2 := w.computeStatus(pod, later)
	if st2.Phase != corev1.PodRunning {
		t.Errorf("phase = %s, want Running", st2.Phase)
	}
	for _, ct := range []corev1.PodConditionType{corev1.PodReady, corev1.ContainersReady, corev1.PodInitialized, corev1.PodReadyToStartContainers} {
		c := findCondition(st2.Conditions, ct)
		if c == nil || c.Status != corev1.ConditionTrue {
			t.Errorf("condition %s = %+v, want True", ct, c)
		}
	}
	if c := findCondition(st2.Conditions, corev1.PodReady); !c.LastTransitionTime.Time.Equal(metav1.NewTime(later).Time) {
		t.Errorf("Ready transition time not updated on change: %v", c.LastTransitionTime)
	}
	if c := findCondition(st2.Conditions, corev1.PodInitialized); !c.LastTransitionTime.Time.Equal(metav1.NewTime(now).Time) {
		t.Errorf("Initialized transition time changed without a status change: %v", c.LastTransitionTime)
	}

	// A readiness gate that is not True keeps the pod unready.
	pod.Spec.ReadinessGates = []corev1.PodReadinessGate{{ConditionType: "example.com/gate"}}
	st3 := w.computeStatus(pod, later)
	if c := findCondition(st3.Conditions, corev1.PodReady); c.Status != corev1.ConditionFalse || c.Reason != "ReadinessGatesNotReady" {
		t.Errorf("Ready with an unmet readiness gate = %+v", c)
	}
}

func TestContainerLogsEndpoint(t *testing.T) {
	dir := t.TempDir()
	a := &Agent{cfg: Config{LogDir: dir, NodeName: "n1"}, workers: map[types.UID]*podWorker{}}
	if err := os.WriteFile(a.containerLogPath("default", "web-1", "web"), []byte("one\ntwo\nthree\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	get := func(url string) (int, string) {
		rec := httptest.NewRecorder()
		mux := a.kubeletMux()
		mux.ServeHTTP(rec, httptest.NewRequest("GET", url, nil))
		return rec.Code, rec.Body.String()
	}
	if code, body := get("/containerLogs/default/web-1/web"); code != 200 || body != "one\ntwo\nthree\n" {
		t.Errorf("full log: %d %q", code, body)
	}
	if code, body := get("/containerLogs/default/web-1/web?tailLines=2"); code != 200 || body != "two\nthree\n" {
		t.Errorf("tailLines=2: %d %q", code, body)
	}
	if code, body := get("/containerLogs/default/web-1/web?limitBytes=5"); code != 200 || body != "one\nt" {
		t.Errorf("limitBytes=5: %d %q", code, body)
	}
	if code, body := get("/containerLogs/default/nope/web"); code != 404 || !strings.Contains(body, "no logs for container") {
		t.Errorf("unknown pod: %d %q", code, body)
	}

	// A running pod: the current run, the previous one, tail within the run.
	pod := testPod()
	pod.Namespace, pod.Name = "default", "web-2"
	pod.Spec.Containers = []corev1.Container{{Name: "web"}}
	w := newPodWorker(a, pod)
	a.workers[pod.UID] = w
	if err := os.WriteFile(a.containerLogPath("default", "web-2", "web"), []byte("run1\nrun2 a\nrun2 b\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if code, body := get("/containerLogs/default/web-2/web?previous=true"); code != 400 {
		t.Errorf("previous without a previous run: %d %q", code, body)
	}
	w.mains[0].logStarts = []int64{0, 5}
	if code, body := get("/containerLogs/default/web-2/web"); code != 200 || body != "run2 a\nrun2 b\n" {
		t.Errorf("current run: %d %q", code, body)
	}
	if code, body := get("/containerLogs/default/web-2/web?previous=true"); code != 200 || body != "run1\n" {
		t.Errorf("previous run: %d %q", code, body)
	}
	if code, body := get("/containerLogs/default/web-2/web?tailLines=1"); code != 200 || body != "run2 b\n" {
		t.Errorf("tailLines=1 of the current run: %d %q", code, body)
	}
}
