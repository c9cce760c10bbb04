package labctl

import (
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"

	"github.com/ironlb/ironlb/test/lab/labnet"
	"github.com/ironlb/ironlb/test/lab/labpki"
)

// APIPort is the API server's port on the control-plane node.
const APIPort = 6443

// IronlbImage is the repository of ironlb's image (the chart's default).
const IronlbImage = "ghcr.io/ironlb/ironlb"

// apiURL is the API server's address as seen from inside the lab.
func apiURL(t *labnet.Topology) string {
	return fmt.Sprintf("https://%s:%d", t.ControlPlane().IP, APIPort)
}

func (l *Lab) pki(name string) string { return filepath.Join(l.PKIDir(), name) }

// writePKI generates the CA, serving and client certificates, the service-account key and
// a kubeconfig per component. Identities are the ones Kubernetes' bootstrap RBAC policy binds.
func (l *Lab) writePKI(t *labnet.Topology, hostServer string) error {
	dir := l.PKIDir()
	ca, err := labpki.NewCA("ilb-lab-ca")
	if err != nil {
		return err
	}
	caKey, err := ca.KeyPEM()
	if err != nil {
		return err
	}
	write := func(name string, data []byte) error {
		_, err := labpki.WriteFile(dir, name, data)
		return err
	}
	if err := write("ca.crt", ca.CertPEM()); err != nil {
		return err
	}
	if err := write("ca.key", caKey); err != nil {
		return err
	}
	cp := t.ControlPlane()
	serving, err := ca.Issue(labpki.CertRequest{
		CommonName: "kube-apiserver",
		DNSNames: []string{"localhost", cp.Name, "kubernetes", "kubernetes.default", "kubernetes.default.svc",
			"kubernetes.default.svc.cluster.local"},
		IPs:    apiServerIPs(t),
		Server: true,
	})
	if err != nil {
		return err
	}
	if err := write("apiserver.crt", serving.CertPEM); err != nil {
		return err
	}
	if err := write("apiserver.key", serving.KeyPEM); err != nil {
		return err
	}
	// The API server's client identity towards the node agents (logs, exec): full access.
	kc, err := ca.Issue(labpki.CertRequest{CommonName: "kube-apiserver-kubelet-client", Organization: []string{"system:masters"}, Client: true})
	if err != nil {
		return err
	}
	if err := write("apiserver-kubelet-client.crt", kc.CertPEM); err != nil {
		return err
	}
	if err := write("apiserver-kubelet-client.key", kc.KeyPEM); err != nil {
		return err
	}
	saKey, saPub, err := labpki.ServiceAccountKey()
	if err != nil {
		return err
	}
	if err := write("sa.key", saKey); err != nil {
		return err
	}
	if err := write("sa.pub", saPub); err != nil {
		return err
	}

	inside := apiURL(t)
	kubeconfigs := []struct {
		file, server, cn string
		groups           []string
	}{
		{"admin.kubeconfig", inside, "kubernetes-admin", []string{"system:masters"}},
		{"kube-controller-manager.kubeconfig", inside, "system:kube-controller-manager", nil},
		{"kube-scheduler.kubeconfig", inside, "system:kube-scheduler", nil},
		{"kube-proxy.kubeconfig", inside, "system:kube-proxy", nil},
	}
	for _, n := range t.Nodes() {
		// The agent is the node's kubelet (system:node:NAME in system:nodes, so the Node
		// authorizer and node lifecycle treat it as one); it is also in system:masters so a
		// request the real kubelet would make differently is never refused in the lab.
		kubeconfigs = append(kubeconfigs, struct {
			file, server, cn string
			groups           []string
		}{nodeKubeconfigName(n.Name), inside, "system:node:" + n.Name, []string{"system:nodes", "system:masters"}})
	}
	for _, k := range kubeconfigs {
		kp, err := ca.Issue(labpki.CertRequest{CommonName: k.cn, Organization: k.groups, Client: true})
		if err != nil {
			return err
		}
		if err := write(k.file, labpki.Kubeconfig(k.server, ca.CertPEM(), k.cn, kp)); err != nil {
			return err
		}
	}
	// The host's kubeconfig: admin through the forwarder.
	admin, err := ca.Issue(labpki.CertRequest{CommonName: "kubernetes-admin", Organization: []string{"system:masters"}, Client: true})
	if err != nil {
		return err
	}
	_, err = labpki.WriteFile(l.StateDir(), "kubeconfig", labpki.Kubeconfig(hostServer, ca.CertPEM(), "kubernetes-admin", admin))
	return err
}

// apiServerIPs are the addresses the API server's certificate is valid for: loopback, the
// control plane's addresses and the kubernetes Service's ClusterIP.
func apiServerIPs(t *labnet.Topology) []net.IP {
	ips := []net.IP{net.IPv4(127, 0, 0, 1)}
	for _, a := range t.ControlPlane().IPs() {
		ips = append(ips, net.IP(a.AsSlice()))
	}
	return append(ips, net.IP(t.KubernetesServiceIP().AsSlice()))
}

func nodeKubeconfigName(node string) string { return "node-" + node + ".kubeconfig" }

// imageTable is the node agents' image table (see the lab contract in TEAM.md).
type imageTable struct {
	Images map[string]imageEntry `json:"images"`
}

type imageEntry struct {
	Layout   string            `json:"layout,omitempty"`
	Program  string            `json:"program,omitempty"`
	Args     []string          `json:"args,omitempty"`
	Commands map[string]string `json:"commands,omitempty"`
}

// metallbImages are MetalLB's images and the command (bin/metallb-<command>) each runs.
var metallbImages = map[string]string{"quay.io/metallb/controller": "controller", "quay.io/metallb/speaker": "speaker"}

func isFile(p string) bool { st, err := os.Stat(p); return err == nil && st.Mode().IsRegular() }

func (l *Lab) imagesPath() string { return filepath.Join(l.StateDir(), "images.json") }

func (l *Lab) writeImageTable() error {
	t := imageTable{Images: map[string]imageEntry{
		// ironlb runs from its image, as users get it (make image, which lab up runs).
		IronlbImage: {Layout: l.ImageLayout()},
		// Stand-ins for images the lab cannot build. traefik/whoami's entrypoint is /whoami.
		"traefik/whoami":    {Program: l.bin("lab-whoami"), Commands: map[string]string{"/whoami": l.bin("lab-whoami")}},
		"nicolaka/netshoot": {Program: "sleep", Args: []string{"infinity"}},
	}}
	// MetalLB's images, for the side-by-side benchmark, when `make metallb` has built its
	// commands from the Go module (hack/metallb); their entrypoints are /controller and /speaker.
	for image, name := range metallbImages {
		if prog := l.bin("metallb-" + name); isFile(prog) {
			t.Images[image] = imageEntry{Program: prog, Commands: map[string]string{"/" + name: prog}}
		}
	}
	b, err := json.MarshalIndent(t, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(l.imagesPath(), append(b, '\n'), 0o644)
}

// controlPlaneProcs are etcd, kube-apiserver, kube-controller-manager and kube-scheduler.
func (l *Lab) controlPlaneProcs(t *labnet.Topology) []Proc {
	cp := t.ControlPlane()
	ns := cp.NS()
	return []Proc{
		{Name: ProcEtcd, NS: ns, Args: []string{l.bin("etcd"),
			"--name=lab", "--data-dir=" + filepath.Join(l.StateDir(), "etcd"),
			"--listen-client-urls=http://127.0.0.1:2379", "--advertise-client-urls=http://127.0.0.1:2379",
			"--listen-peer-urls=http://127.0.0.1:2380", "--initial-advertise-peer-urls=http://127.0.0.1:2380",
			"--initial-cluster=lab=http://127.0.0.1:2380", "--listen-metrics-urls=http://127.0.0.1:2381",
			// A throw-away cluster: durability is not worth the fsync latency on a shared disk.
			"--unsafe-no-fsync", "--quota-backend-bytes=1073741824", "--log-level=warn"}},
		{Name: ProcAPIServer, NS: ns, Args: []string{l.bin("kube-apiserver"),
			"--advertise-address=" + cp.IP.String(), "--bind-address=0.0.0.0", fmt.Sprintf("--secure-port=%d", APIPort),
			"--etcd-servers=http://127.0.0.1:2379",
			"--client-ca-file=" + l.pki("ca.crt"),
			"--tls-cert-file=" + l.pki("apiserver.crt"), "--tls-private-key-file=" + l.pki("apiserver.key"),
			"--kubelet-client-certificate=" + l.pki("apiserver-kubelet-client.crt"),
			"--kubelet-client-key=" + l.pki("apiserver-kubelet-client.key"),
			"--kubelet-preferred-address-types=InternalIP,Hostname",
			"--service-cluster-ip-range=" + labnet.Join(t.ServiceSubnets()),
			"--service-node-port-range=30000-32767",
			"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
			"--service-account-key-file=" + l.pki("sa.pub"),
			"--service-account-signing-key-file=" + l.pki("sa.key"),
			"--authorization-mode=Node,RBAC",
			"--allow-privileged=true",
			"--profiling=false",
			"--v=1"}},
		{Name: ProcControllerManager, NS: ns, Args: []string{l.bin("kube-controller-manager"),
			"--kubeconfig=" + l.pki("kube-controller-manager.kubeconfig"),
			"--bind-address=127.0.0.1", "--leader-elect=false",
			"--controllers=*,bootstrapsigner,tokencleaner",
			"--use-service-account-credentials=true",
			"--service-account-private-key-file=" + l.pki("sa.key"),
			"--root-ca-file=" + l.pki("ca.crt"),
			"--cluster-signing-cert-file=" + l.pki("ca.crt"), "--cluster-signing-key-file=" + l.pki("ca.key"),
			"--cluster-cidr=" + labnet.Join(t.PodSubnets()), "--allocate-node-cidrs=false",
			"--service-cluster-ip-range=" + labnet.Join(t.ServiceSubnets()),
			"--profiling=false",
			"--v=1"}},
		{Name: "kube-scheduler", NS: ns, Args: []string{l.bin("kube-scheduler"),
			"--kubeconfig=" + l.pki("kube-scheduler.kubeconfig"),
			"--bind-address=127.0.0.1", "--leader-elect=false", "--profiling=false", "--v=1"}},
	}
}

// nodeProcs are a node's kube-proxy (in the recorded proxy mode) and node agent.
func (l *Lab) nodeProcs(t *labnet.Topology, n labnet.Host) []Proc {
	mode := ProxyIptables
	if st, _ := l.ReadState(); st != nil && st.ProxyMode != "" {
		mode = st.ProxyMode
	}
	ns := n.NS()
	agent := []string{l.bin("lab-agent"),
		"--node-name", n.Name, "--node-ip", labnet.Join(n.IPs()), "--pod-cidr", labnet.Join(n.PodCIDRs()),
		"--kubeconfig", l.pki(nodeKubeconfigName(n.Name)), "--state-dir", l.NodeDir(n.Name),
		"--netns", ns, "--images", l.imagesPath(), "--kubernetes-service-host", t.KubernetesServiceIP().String()}
	if n.ControlPlane {
		agent = append(agent, "--control-plane")
	}
	return []Proc{
		{Name: "kube-proxy-" + n.Name, NS: ns, Args: []string{l.bin("kube-proxy"),
			"--kubeconfig=" + l.pki("kube-proxy.kubeconfig"),
			"--hostname-override=" + n.Name,
			// The node IP, so kube-proxy need not wait for the agent to register the Node.
			"--bind-address=" + n.IP.String(),
			"--proxy-mode=" + mode,
			"--cluster-cidr=" + labnet.Join(t.PodSubnets()),
			// The global conntrack table size is not writable from a namespace.
			"--conntrack-max-per-core=0",
			"--v=1"}},
		{Name: "lab-agent-" + n.Name, NS: ns, Args: agent},
	}
}
