package agent

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/tools/record"
)

// Config is the agent's configuration; the lab passes it as flags.
type Config struct {
	NodeName string
	NodeIP   string
	PodCIDR  netip.Prefix
	// NodeIP6 and PodCIDR6 make the node dual-stack: its second InternalIP and IPv6 pod
	// range ("" and invalid: IPv4 only).
	NodeIP6    string
	PodCIDR6   netip.Prefix
	Kubeconfig string
	StateDir   string
	// NetNS is the node's network namespace; pod veths are created in it and
	// hostNetwork pods run in it. The agent itself is expected to run there too
	// (it dials pod IPs for probes and serves logs on the node IP).
	NetNS        string
	Images       string
	ControlPlane bool
	LogDir       string
	KubeletPort  int
	// KubernetesServiceHost is used for KUBERNETES_SERVICE_HOST when the
	// default/kubernetes Service cannot be read.
	KubernetesServiceHost string
	// RestConfig, when set, is used instead of Kubeconfig (tests).
	RestConfig *rest.Config
	// Self is the agent's own executable, run as `Self pod-exec ...`.
	Self string
	Log  logr.Logger
}

// Agent is one node's agent.
type Agent struct {
	cfg    Config
	log    logr.Logger
	client kubernetes.Interface
	caData []byte
	images *ImageTable
	ipam   *IPAM
	ipam6  *IPAM // nil on an IPv4-only node
	net    Net

	events   record.EventBroadcaster
	recorder record.EventRecorder

	mu      sync.Mutex
	workers map[types.UID]*podWorker
	// removed holds pods this agent stopped and deleted, until the API
	// server's delete event arrives, so late updates do not restart them.
	removed map[types.UID]bool
	wg      sync.WaitGroup

	svcMu       sync.Mutex
	kubeSvcHost string
}

// New checks cfg and prepares an agent; Run starts it.
func New(cfg Config) (*Agent, error) {
	if cfg.NodeName == "" || cfg.NodeIP == "" {
		return nil, errors.New("node name and node IP are required")
	}
	if net.ParseIP(cfg.NodeIP) == nil {
		return nil, fmt.Errorf("node IP %q is not an IP address", cfg.NodeIP)
	}
	if cfg.NodeIP6 != "" {
		if a, err := netip.ParseAddr(cfg.NodeIP6); err != nil || !a.Is6() {
			return nil, fmt.Errorf("IPv6 node IP %q is not an IPv6 address", cfg.NodeIP6)
		}
	}
	if cfg.StateDir == "" {
		return nil, errors.New("state dir is required")
	}
	if cfg.LogDir == "" {
		cfg.LogDir = filepath.Join(filepath.Dir(filepath.Clean(cfg.StateDir)), "logs", "pods")
	}
	if cfg.KubeletPort == 0 {
		cfg.KubeletPort = 10250
	}
	if cfg.KubernetesServiceHost == "" {
		cfg.KubernetesServiceHost = "10.200.1.1"
	}
	if cfg.Self == "" {
		self, err := os.Executable()
		if err != nil {
			return nil, fmt.Errorf("finding the agent's own executable: %w", err)
		}
		cfg.Self = self
	}
	for _, d := range []string{cfg.StateDir, filepath.Join(cfg.StateDir, "pods"), cfg.LogDir} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, fmt.Errorf("creating %s: %w", d, err)
		}
	}
	images := &ImageTable{Images: map[string]ImageEntry{}}
	if cfg.Images != "" {
		var err error
		if images, err = LoadImageTable(cfg.Images); err != nil {
			return nil, err
		}
	}
	images.UnpackInto(filepath.Join(cfg.StateDir, "images"))
	ipam, err := NewIPAM(cfg.PodCIDR, filepath.Join(cfg.StateDir, "ipam.json"))
	if err != nil {
		return nil, err
	}
	var ipam6 *IPAM
	if cfg.PodCIDR6.IsValid() {
		if ipam6, err = NewIPAM(cfg.PodCIDR6, filepath.Join(cfg.StateDir, "ipam6.json")); err != nil {
			return nil, err
		}
	}
	restCfg := cfg.RestConfig
	if restCfg == nil {
		if restCfg, err = clientcmd.BuildConfigFromFlags("", cfg.Kubeconfig); err != nil {
			return nil, fmt.Errorf("loading kubeconfig %q: %w", cfg.Kubeconfig, err)
		}
	} else {
		restCfg = rest.CopyConfig(restCfg)
	}
	restCfg.UserAgent = "lab-agent/" + cfg.NodeName
	restCfg.QPS, restCfg.Burst = 50, 100
	caData, err := caFromRest(restCfg)
	if err != nil {
		return nil, err
	}
	client, err := kubernetes.NewForConfig(restCfg)
	if err != nil {
		return nil, fmt.Errorf("creating the API client: %w", err)
	}
	events := record.NewBroadcaster()
	return &Agent{
		events: events, recorder: events.NewRecorder(scheme.Scheme, corev1.EventSource{Component: "kubelet", Host: cfg.NodeName}),
		cfg: cfg, log: cfg.Log, client: client, caData: caData, images: images, ipam: ipam, ipam6: ipam6,
		net: Net{NodeNS: cfg.NetNS}, workers: map[types.UID]*podWorker{}, removed: map[types.UID]bool{},
	}, nil
}

func caFromRest(c *rest.Config) ([]byte, error) {
	if len(c.CAData) > 0 {
		return c.CAData, nil
	}
	if c.CAFile != "" {
		b, err := os.ReadFile(c.CAFile)
		if err != nil {
			return nil, fmt.Errorf("reading the kubeconfig's CA %s: %w", c.CAFile, err)
		}
		return b, nil
	}
	return nil, nil
}

// Run registers the node and runs its pods until ctx ends. On return the
// pods' processes have been asked to stop; their namespaces and addresses are
// kept so that the next agent run restarts them in place.
func (a *Agent) Run(ctx context.Context) error {
	a.log.Info("Starting lab node agent", "node", a.cfg.NodeName, "nodeIPs", a.nodeIPs(), "podCIDR", a.cfg.PodCIDR.String(), "podCIDR6", a.cfg.PodCIDR6.String(), "netns", a.cfg.NetNS, "images", a.images.Known())
	a.killLeftovers()
	a.events.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: a.client.CoreV1().Events("")})
	defer a.events.Shutdown()
	if err := a.registerNode(ctx); err != nil {
		return fmt.Errorf("registering node %s: %w", a.cfg.NodeName, err)
	}
	var bg sync.WaitGroup
	bg.Add(2)
	go func() { defer bg.Done(); a.heartbeat(ctx) }()
	go func() {
		defer bg.Done()
		if err := a.serveKubelet(ctx); err != nil {
			a.log.Error(err, "Kubelet endpoint stopped; kubectl logs will not work", "port", a.cfg.KubeletPort)
		}
	}()

	factory := informers.NewSharedInformerFactoryWithOptions(a.client, 0, informers.WithTweakListOptions(func(o *metav1.ListOptions) {
		o.FieldSelector = fields.OneTermEqualSelector("spec.nodeName", a.cfg.NodeName).String()
	}))
	podInformer := factory.Core().V1().Pods().Informer()
	_, err := podInformer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { a.podChanged(ctx, obj) },
		UpdateFunc: func(_, obj any) { a.podChanged(ctx, obj) },
		DeleteFunc: func(obj any) {
			if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = t.Obj
			}
			if pod, ok := obj.(*corev1.Pod); ok {
				a.podGone(pod.UID)
			}
		},
	})
	if err != nil {
		return fmt.Errorf("watching pods: %w", err)
	}
	factory.Start(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), podInformer.HasSynced) {
		factory.Shutdown()
		bg.Wait()
		return ctx.Err()
	}
	a.collectGarbage(podInformer.GetStore())

	<-ctx.Done()
	a.log.Info("Stopping: asking pod processes to stop, keeping their network and addresses")
	factory.Shutdown()
	a.wg.Wait()
	bg.Wait()
	return nil
}

func (a *Agent) podChanged(ctx context.Context, obj any) {
	pod, ok := obj.(*corev1.Pod)
	if !ok || pod.Spec.NodeName != a.cfg.NodeName {
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if w, ok := a.workers[pod.UID]; ok {
		w.update(pod)
		return
	}
	if ctx.Err() != nil || a.removed[pod.UID] {
		return
	}
	w := newPodWorker(a, pod)
	a.workers[pod.UID] = w
	a.wg.Add(1)
	go func() {
		defer a.wg.Done()
		removed := w.run(ctx)
		a.mu.Lock()
		delete(a.workers, pod.UID)
		if removed {
			a.removed[pod.UID] = true
		}
		a.mu.Unlock()
	}()
}

// podGone handles a pod that vanished from the API without a graceful
// deletion through us (force delete): kill it at once.
func (a *Agent) podGone(uid types.UID) {
	a.mu.Lock()
	w := a.workers[uid]
	delete(a.removed, uid)
	a.mu.Unlock()
	if w != nil {
		w.gone()
	}
}

func (a *Agent) workerByName(namespace, name string) *podWorker {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, w := range a.workers {
		p := w.latest()
		if p.Namespace == namespace && p.Name == name {
			return w
		}
	}
	return nil
}

func (a *Agent) podDir(uid types.UID) string {
	return filepath.Join(a.cfg.StateDir, "pods", string(uid))
}

// collectGarbage removes the state, network and address of pods this node
// ran before a restart that no longer exist.
func (a *Agent) collectGarbage(store cache.Store) {
	live := map[string]bool{}
	for _, obj := range store.List() {
		if p, ok := obj.(*corev1.Pod); ok {
			live[string(p.UID)] = true
		}
	}
	entries, _ := os.ReadDir(filepath.Join(a.cfg.StateDir, "pods"))
	for _, e := range entries {
		if live[e.Name()] {
			continue
		}
		uid := types.UID(e.Name())
		a.log.Info("Removing leftovers of a pod that no longer exists", "podUID", uid)
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		a.net.Teardown(ctx, uid)
		cancel()
		if err := os.RemoveAll(a.podDir(uid)); err != nil {
			a.log.Error(err, "Cannot remove the directory of a pod that no longer exists", "podUID", uid)
		}
	}
	for _, k := range a.ipam.Keys() {
		if !live[k] {
			if err := a.releasePodIPs(k); err != nil {
				a.log.Error(err, "Releasing the addresses of a vanished pod failed", "podUID", k)
			}
		}
	}
}

// nodeIPs are the node's InternalIPs, the primary (IPv4) first.
func (a *Agent) nodeIPs() []string {
	if a.cfg.NodeIP6 != "" {
		return []string{a.cfg.NodeIP, a.cfg.NodeIP6}
	}
	return []string{a.cfg.NodeIP}
}

// hostIPs is nodeIPs as a pod status reports them.
func (a *Agent) hostIPs() []corev1.HostIP {
	var out []corev1.HostIP
	for _, ip := range a.nodeIPs() {
		out = append(out, corev1.HostIP{IP: ip})
	}
	return out
}

// allocatePodIPs gives a pod an address of every family the node has, IPv4 first.
func (a *Agent) allocatePodIPs(key string) ([]netip.Addr, error) {
	ip, err := a.ipam.Allocate(key)
	if err != nil {
		return nil, err
	}
	ips := []netip.Addr{ip}
	if a.ipam6 != nil {
		ip6, err := a.ipam6.Allocate(key)
		if err != nil {
			return nil, err
		}
		ips = append(ips, ip6)
	}
	return ips, nil
}

// releasePodIPs frees a pod's addresses.
func (a *Agent) releasePodIPs(key string) error {
	err := a.ipam.Release(key)
	if a.ipam6 != nil {
		err = errors.Join(err, a.ipam6.Release(key))
	}
	return err
}

// kubernetesServiceHost returns the ClusterIP of default/kubernetes.
func (a *Agent) kubernetesServiceHost(ctx context.Context) string {
	a.svcMu.Lock()
	defer a.svcMu.Unlock()
	if a.kubeSvcHost != "" {
		return a.kubeSvcHost
	}
	svc, err := a.client.CoreV1().Services("default").Get(ctx, "kubernetes", metav1.GetOptions{})
	if err == nil && svc.Spec.ClusterIP != "" {
		a.kubeSvcHost = svc.Spec.ClusterIP
		return a.kubeSvcHost
	}
	return a.cfg.KubernetesServiceHost
}

// Secret implements ObjectSource.
func (a *Agent) Secret(ctx context.Context, namespace, name string) (*corev1.Secret, error) {
	return a.client.CoreV1().Secrets(namespace).Get(ctx, name, metav1.GetOptions{})
}

// ConfigMap implements ObjectSource. A missing kube-root-ca.crt (published a
// moment after the controller manager starts) is served from the
// kubeconfig's CA, which is the same certificate.
func (a *Agent) ConfigMap(ctx context.Context, namespace, name string) (*corev1.ConfigMap, error) {
	cm, err := a.client.CoreV1().ConfigMaps(namespace).Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) && name == "kube-root-ca.crt" && len(a.caData) > 0 {
		return &corev1.ConfigMap{Data: map[string]string{"ca.crt": string(a.caData)}}, nil
	}
	return cm, err
}
