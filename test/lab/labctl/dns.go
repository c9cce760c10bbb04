package labctl

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/ironlb/ironlb/test/lab/labnet"
)

// The lab's DNS (lab up --dns) runs on its own host, labnet.DNSName, outside the cluster
// like mypc: BIND's named, authoritative for DNSZone, accepting RFC2136 dynamic updates and
// zone transfers signed with a TSIG key, and external-dns (bin/external-dns, pinned in
// hack/external-dns), which watches Services through the API server with a service account
// token and publishes every LoadBalancer Service that carries HostnameAnnotation: one A
// (AAAA) record per IPv4 (IPv6) address of its status.loadBalancer.ingress, so a Service with
// several IPs is published as a round-robin set. mypc and mypc2 resolve through it: lab up
// writes /etc/netns/ilb-mypc{,2}/resolv.conf, which `ip netns exec` (lab exec, Lab.Command)
// mounts over /etc/resolv.conf, so `lab exec mypc -- curl http://web.lb.lab/` works.
const (
	// DNSZone is the zone the lab's DNS server is authoritative for (no trailing dot).
	DNSZone = "lb.lab"
	// DNSPort is the DNS server's port (UDP and TCP) on labnet.DNSIP.
	DNSPort = 53
	// DNSAnnotationPrefix is the prefix of the annotations external-dns reads: the
	// established one (its documentation's, and MetalLB users' Services carry it), passed
	// with --annotation-prefix since external-dns v0.22.0's default is
	// "external-dns.kubernetes.io/".
	DNSAnnotationPrefix = "external-dns.alpha.kubernetes.io/"
	// HostnameAnnotation makes external-dns publish a Service's ingress IPs under the
	// names it lists (comma-separated), e.g. "web.lb.lab.".
	HostnameAnnotation = DNSAnnotationPrefix + "hostname"
	// TargetAnnotation overrides the addresses external-dns publishes for a Service
	// (comma-separated) instead of its ingress IPs.
	TargetAnnotation = DNSAnnotationPrefix + "target"
	// DNSNamespace holds external-dns' service account.
	DNSNamespace = "external-dns"
	// DNSServiceAccount is external-dns' identity; the ClusterRole and binding of the same
	// name let it list and watch what its service source reads.
	DNSServiceAccount = "external-dns"
	// DNSTSIGKeyName names the TSIG key that signs external-dns' updates and transfers.
	DNSTSIGKeyName = "externaldns-key"
	// DNSTSIGAlgorithm is the TSIG key's algorithm (named's and external-dns' spelling).
	DNSTSIGAlgorithm = "hmac-sha256"
	// DNSOwnerID is external-dns' TXT registry owner: it only changes records it owns.
	DNSOwnerID = "ironlb-lab"
	// DNSSyncInterval is external-dns' resync interval; Service changes also trigger a
	// sync (--events), at most once a second.
	DNSSyncInterval = 2 * time.Second
	// ExternalDNSMetricsPort serves external-dns' /healthz and /metrics on labnet.DNSIP.
	ExternalDNSMetricsPort = 7979

	namedProc       = "named"
	externalDNSProc = "external-dns"
	dnsTokenTTL     = 30 * 24 * time.Hour
	// resolvConfMarker starts the resolv.conf files the lab writes under /etc/netns, so
	// lab down removes those and nothing else.
	resolvConfMarker = "# Written by the ironlb lab (lab up --dns); lab down removes it."
	etcNetns         = "/etc/netns"
)

// dnsClients are the hosts whose resolver is the lab's DNS server.
var dnsClients = []string{labnet.ClientName, labnet.SecondClientName}

// DNSServer is the lab's DNS server as lab hosts reach it.
func DNSServer() netip.AddrPort { return netip.AddrPortFrom(labnet.DNSIP, DNSPort) }

// DNSFQDN is the fully qualified name of label in the lab's zone: "web" -> "web.lb.lab.".
// A name already in the zone is returned fully qualified.
func DNSFQDN(label string) string {
	name := strings.TrimSuffix(label, ".")
	if name != DNSZone && !strings.HasSuffix(name, "."+DNSZone) {
		name += "." + DNSZone
	}
	return name + "."
}

// DNSDir holds named's configuration, zone, journal and TSIG key, and external-dns'
// kubeconfig and token.
func (l *Lab) DNSDir() string { return filepath.Join(l.StateDir(), "dns") }

// DNSRunning reports whether the lab runs its DNS server and external-dns.
func (l *Lab) DNSRunning() bool { return l.procAlive(namedProc) && l.procAlive(externalDNSProc) }

// procAlive reports whether the lab process name (its pid file) is running.
func (l *Lab) procAlive(name string) bool {
	pid, err := readPid(l.pidFile(name))
	return err == nil && pid > 1 && alive(pid)
}

// EnableDNS gives a running lab the DNS host, named and external-dns, and points mypc's
// and mypc2's resolver at it, as `lab up --dns` does; it starts whichever of named and
// external-dns is not running, and does nothing if both are.
func (l *Lab) EnableDNS(ctx context.Context) error {
	st, err := l.ReadState()
	if err != nil {
		return err
	}
	if st == nil || !st.Ready {
		return errors.New("no lab is running: start one with `make lab-up` (LAB_DNS=1 brings the DNS up with it)")
	}
	if st.DNS && l.DNSRunning() {
		return nil
	}
	topo, err := l.Topology()
	if err != nil {
		return err
	}
	topo.AddDNS()
	return l.addDNS(ctx, topo, st)
}

// addDNS adds the DNS host, named and external-dns to a running lab.
func (l *Lab) addDNS(ctx context.Context, topo *labnet.Topology, st *State) error {
	return l.addHost(ctx, topo, st, labnet.DNSName, fmt.Sprintf("named and external-dns (%s, zone %s)", DNSServer(), DNSZone),
		l.startDNS, func(s *State) { s.DNS = true })
}

// startDNS writes named's configuration and zone, starts named on the DNS host and waits
// until it serves the zone, gives external-dns a service account, RBAC and a token, starts
// it and waits until it is healthy, then makes mypc and mypc2 resolve through named. A
// process already running is left alone.
func (l *Lab) startDNS(ctx context.Context, t *labnet.Topology, c kubernetes.Interface) error {
	h, ok := t.Host(labnet.DNSName)
	if !ok {
		return fmt.Errorf("the topology has no %s host", labnet.DNSName)
	}
	named, err := exec.LookPath("named")
	if err != nil {
		return fmt.Errorf("lab up --dns needs BIND's named: run hack/ensure-packages.sh (or apt-get install bind9): %w", err)
	}
	exe := l.bin("external-dns")
	if _, err := os.Stat(exe); err != nil {
		return fmt.Errorf("lab up --dns needs %s: build it with `make external-dns` (pinned in hack/external-dns/go.mod): %w", exe, err)
	}
	dir := l.DNSDir()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	secret, err := l.tsigSecret()
	if err != nil {
		return err
	}
	conf := filepath.Join(dir, "named.conf")
	if err := os.WriteFile(conf, []byte(l.namedConfig(h, secret)), 0o600); err != nil {
		return err
	}
	// The zone file is named's starting point only: updates go to the journal (and are
	// merged into the file on exit), so an existing zone is kept across restarts.
	if zone := filepath.Join(dir, DNSZone+".zone"); !isFile(zone) {
		if err := os.WriteFile(zone, []byte(namedZone(h)), 0o644); err != nil {
			return err
		}
	}
	// -g: foreground, log to stderr (the lab's log); one worker thread is plenty.
	if !l.procAlive(namedProc) {
		if _, err := l.start(Proc{Name: namedProc, NS: h.NS(), Args: []string{named, "-g", "-n", "1", "-c", conf}}); err != nil {
			return err
		}
	}
	if err := l.waitNamed(ctx, h, 30*time.Second); err != nil {
		return err
	}

	kubeconfig, err := l.externalDNSKubeconfig(ctx, t, c)
	if err != nil {
		return err
	}
	metrics := netip.AddrPortFrom(h.IP, ExternalDNSMetricsPort)
	if l.procAlive(externalDNSProc) {
		return l.writeResolvConfs()
	}
	if _, err := l.start(Proc{Name: externalDNSProc, NS: h.NS(), Args: []string{exe,
		"--kubeconfig=" + kubeconfig,
		"--source=service", "--service-type-filter=LoadBalancer",
		"--annotation-prefix=" + DNSAnnotationPrefix,
		"--provider=rfc2136",
		"--rfc2136-host=" + labnet.DNSIP.String(), "--rfc2136-port=" + strconv.Itoa(DNSPort),
		"--rfc2136-zone=" + DNSZone, // no trailing dot: v0.22.0 matches names by plain suffix
		"--rfc2136-tsig-keyname=" + DNSTSIGKeyName, "--rfc2136-tsig-secret=" + secret,
		"--rfc2136-tsig-secret-alg=" + DNSTSIGAlgorithm,
		"--rfc2136-axfr", // reads the zone by AXFR, so --policy=sync can delete
		"--domain-filter=" + DNSZone,
		"--registry=txt", "--txt-owner-id=" + DNSOwnerID,
		"--policy=sync",
		"--interval=" + DNSSyncInterval.String(), "--events", "--min-event-sync-interval=1s",
		"--metrics-address=" + metrics.String(),
		"--log-level=info"}}); err != nil {
		return err
	}
	if err := waitHTTPOK(ctx, h.NS(), "http://"+metrics.String()+"/healthz", 60*time.Second); err != nil {
		return fmt.Errorf("external-dns is not healthy (see %s): %w", filepath.Join(l.LogDir(), externalDNSProc+".log"), err)
	}
	return l.writeResolvConfs()
}

// tsigSecret returns the TSIG key's secret, creating it (32 random bytes, base64) once per lab.
func (l *Lab) tsigSecret() (string, error) {
	path := filepath.Join(l.DNSDir(), "tsig.secret")
	if b, err := os.ReadFile(path); err == nil && len(bytes.TrimSpace(b)) > 0 {
		return string(bytes.TrimSpace(b)), nil
	}
	key := make([]byte, 32)
	if _, err := rand.Read(key); err != nil {
		return "", err
	}
	secret := base64.StdEncoding.EncodeToString(key)
	return secret, os.WriteFile(path, []byte(secret+"\n"), 0o600)
}

// namedConfig is named's configuration: authoritative only (no recursion, so it never
// queries anything outside the lab), listening on the DNS host's addresses, the zone
// updatable and transferable with the TSIG key, answers in random order.
func (l *Lab) namedConfig(h labnet.Host, secret string) string {
	dir := l.DNSDir()
	v6 := "none;"
	if h.IP6.IsValid() {
		v6 = h.IP6.String() + ";"
	}
	return fmt.Sprintf(`# Written by lab up --dns.
options {
	directory %[1]q;
	pid-file %[2]q;
	session-keyfile %[3]q;
	managed-keys-directory %[1]q;
	listen-on port %[4]d { %[5]s; 127.0.0.1; };
	listen-on-v6 port %[4]d { %[6]s };
	recursion no;
	allow-query { any; };
	notify no;
	dnssec-validation no;
	# A round-robin set is answered in a new random order each time (BIND's default is
	# random too; stated, as clients' spreading depends on it).
	rrset-order { order random; };
};
# No rndc channel.
controls { };
key %[7]q {
	algorithm %[8]s;
	secret %[9]q;
};
zone %[10]q {
	type primary;
	file %[11]q;
	allow-update { key %[7]q; };
	allow-transfer { key %[7]q; };
};
`, dir, filepath.Join(dir, "named.pid"), filepath.Join(dir, "session.key"), DNSPort, h.IP, v6,
		DNSTSIGKeyName, DNSTSIGAlgorithm, secret, DNSZone, filepath.Join(dir, DNSZone+".zone"))
}

// namedZone is the zone's initial content: SOA, NS and the name server's own address.
func namedZone(h labnet.Host) string {
	var aaaa string
	if h.IP6.IsValid() {
		aaaa = fmt.Sprintf("ns1\tIN\tAAAA\t%s\n", h.IP6)
	}
	return fmt.Sprintf(`; Written by lab up --dns; external-dns adds records by RFC2136 updates.
$ORIGIN %[1]s.
$TTL 30
@	IN	SOA	ns1.%[1]s. hostmaster.%[1]s. 1 30 30 600 5
@	IN	NS	ns1.%[1]s.
ns1	IN	A	%[2]s
%[3]s`, DNSZone, h.IP, aaaa)
}

// waitNamed polls until named answers for its own name server's address.
func (l *Lab) waitNamed(ctx context.Context, h labnet.Host, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	var last error
	for time.Now().Before(deadline) {
		ips, err := l.LookupDNS(ctx, h.Name, "ns1."+DNSZone+".")
		if err == nil && slices.Contains(ips, h.IP) {
			return nil
		}
		if last = err; err == nil {
			last = fmt.Errorf("ns1.%s. resolves to %v", DNSZone, ips)
		}
		if pid, perr := readPid(l.pidFile(namedProc)); perr != nil || !alive(pid) {
			b, _ := os.ReadFile(filepath.Join(l.LogDir(), namedProc+".log"))
			return fmt.Errorf("named exited; last lines of its log:\n%s", tail(string(b), 15))
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
	return fmt.Errorf("named does not serve %s after %s (see %s): %w", DNSZone, timeout, filepath.Join(l.LogDir(), namedProc+".log"), last)
}

// externalDNSKubeconfig creates external-dns' namespace, service account, ClusterRole and
// ClusterRoleBinding (if missing), and writes a kubeconfig with a token of that account.
func (l *Lab) externalDNSKubeconfig(ctx context.Context, t *labnet.Topology, c kubernetes.Interface) (string, error) {
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: DNSNamespace}}
	if _, err := c.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return "", fmt.Errorf("creating namespace %s: %w", DNSNamespace, err)
	}
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: DNSServiceAccount, Namespace: DNSNamespace}}
	if _, err := c.CoreV1().ServiceAccounts(DNSNamespace).Create(ctx, sa, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return "", fmt.Errorf("creating service account %s/%s: %w", DNSNamespace, DNSServiceAccount, err)
	}
	read := []string{"get", "list", "watch"}
	role := &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: DNSServiceAccount},
		Rules: []rbacv1.PolicyRule{
			{APIGroups: []string{""}, Resources: []string{"services", "endpoints", "pods", "nodes"}, Verbs: read},
			{APIGroups: []string{"discovery.k8s.io"}, Resources: []string{"endpointslices"}, Verbs: read},
		},
	}
	if _, err := c.RbacV1().ClusterRoles().Create(ctx, role, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return "", fmt.Errorf("creating ClusterRole %s: %w", role.Name, err)
	}
	binding := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: DNSServiceAccount},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role.Name},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: DNSServiceAccount, Namespace: DNSNamespace}},
	}
	if _, err := c.RbacV1().ClusterRoleBindings().Create(ctx, binding, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return "", fmt.Errorf("creating ClusterRoleBinding %s: %w", binding.Name, err)
	}
	ttl := int64(dnsTokenTTL.Seconds())
	tr, err := c.CoreV1().ServiceAccounts(DNSNamespace).CreateToken(ctx, DNSServiceAccount,
		&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &ttl}}, metav1.CreateOptions{})
	if err != nil {
		return "", fmt.Errorf("requesting a token of %s/%s: %w", DNSNamespace, DNSServiceAccount, err)
	}
	path := filepath.Join(l.DNSDir(), "external-dns.kubeconfig")
	kc := fmt.Sprintf(`# Written by lab up --dns: external-dns' service account, from the DNS host.
apiVersion: v1
kind: Config
clusters:
- name: lab
  cluster: {server: %q, certificate-authority: %q}
users:
- name: %s
  user: {token: %q}
contexts:
- name: lab
  context: {cluster: lab, user: %s, namespace: %s}
current-context: lab
`, apiURL(t), l.pki("ca.crt"), DNSServiceAccount, tr.Status.Token, DNSServiceAccount, DNSNamespace)
	return path, os.WriteFile(path, []byte(kc), 0o600)
}

// resolvConf is what mypc and mypc2 resolve with: the lab's DNS server, names relative to
// the lab's zone (curl http://web/ works too), and a quick retry.
func resolvConf() string {
	return fmt.Sprintf("%s\nnameserver %s\nsearch %s\noptions timeout:1 attempts:2\n", resolvConfMarker, labnet.DNSIP, DNSZone)
}

// writeResolvConfs writes /etc/netns/<ns>/resolv.conf for each DNS client, which `ip netns
// exec` bind-mounts over /etc/resolv.conf. Processes the lab starts with nsenter (daemons,
// pods) do not see it: only commands run on a host with Lab.Command / `lab exec`.
func (l *Lab) writeResolvConfs() error {
	if _, err := os.Stat(etcNetns); errors.Is(err, os.ErrNotExist) {
		if err := os.Mkdir(etcNetns, 0o755); err != nil {
			return err
		}
		// Remembered so that lab down removes /etc/netns again, and only then.
		if err := os.WriteFile(filepath.Join(l.DNSDir(), "created-etc-netns"), nil, 0o644); err != nil {
			return err
		}
	}
	for _, host := range dnsClients {
		dir := filepath.Join(etcNetns, labnet.NSPrefix+host)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(dir, "resolv.conf"), []byte(resolvConf()), 0o644); err != nil {
			return err
		}
	}
	return nil
}

// removeResolvConfs removes the resolv.conf files the lab wrote under /etc/netns (those
// starting with resolvConfMarker, of lab host namespaces), their directories when empty, and
// /etc/netns when the lab created it and it is empty. It returns what it removed.
func (l *Lab) removeResolvConfs() ([]string, error) {
	entries, err := os.ReadDir(etcNetns)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var removed []string
	var errs []error
	for _, e := range entries {
		if !e.IsDir() || !labnet.IsLabNS(e.Name()) {
			continue
		}
		dir := filepath.Join(etcNetns, e.Name())
		path := filepath.Join(dir, "resolv.conf")
		b, err := os.ReadFile(path)
		if err != nil || !strings.HasPrefix(string(b), resolvConfMarker+"\n") {
			continue
		}
		if err := os.Remove(path); err != nil {
			errs = append(errs, err)
			continue
		}
		removed = append(removed, path)
		if err := os.Remove(dir); err != nil && !isNotEmpty(err) {
			errs = append(errs, err)
		}
	}
	if isFile(filepath.Join(l.DNSDir(), "created-etc-netns")) {
		if err := os.Remove(etcNetns); err != nil && !isNotEmpty(err) && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	return removed, errors.Join(errs...)
}

func isNotEmpty(err error) bool {
	var pe *os.PathError
	return errors.As(err, &pe) && strings.Contains(pe.Err.Error(), "not empty")
}

// LookupDNS asks the lab's DNS server, from lab host host (e.g. labnet.ClientName), for
// name's A and AAAA records (name is taken as fully qualified) and returns the addresses,
// sorted. It queries over TCP from inside the host's namespace, so the caller needs no
// route into the lab; an unknown name gives no addresses and no error.
func (l *Lab) LookupDNS(ctx context.Context, host, name string) ([]netip.Addr, error) {
	ns, err := l.hostNS(host)
	if err != nil {
		return nil, err
	}
	r := &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return labnet.DialInNS(ctx, ns, DNSServer())
	}}
	if !strings.HasSuffix(name, ".") {
		name += "."
	}
	qctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	ips, err := r.LookupNetIP(qctx, "ip", name)
	var de *net.DNSError
	if errors.As(err, &de) && de.IsNotFound {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	for i := range ips {
		ips[i] = ips[i].Unmap()
	}
	slices.SortFunc(ips, func(a, b netip.Addr) int { return a.Compare(b) })
	return slices.Compact(ips), nil
}

// WaitDNS polls the lab's DNS server (from mypc) until name's A and AAAA records are
// exactly want (in any order; none for an empty want), and returns the last answer.
func (l *Lab) WaitDNS(ctx context.Context, name string, want []netip.Addr, timeout time.Duration) ([]netip.Addr, error) {
	want = slices.Clone(want)
	slices.SortFunc(want, func(a, b netip.Addr) int { return a.Compare(b) })
	want = slices.Compact(want)
	deadline := time.Now().Add(timeout)
	for {
		got, err := l.LookupDNS(ctx, labnet.ClientName, name)
		if err == nil && slices.Equal(got, want) {
			return got, nil
		}
		if time.Now().After(deadline) {
			if err != nil {
				return got, fmt.Errorf("%s: want %v after %s: %w", name, want, timeout, err)
			}
			return got, fmt.Errorf("%s resolves to %v, want %v, after %s (external-dns' log: %s)", name, got, want, timeout,
				filepath.Join(l.LogDir(), externalDNSProc+".log"))
		}
		select {
		case <-ctx.Done():
			return got, ctx.Err()
		case <-time.After(250 * time.Millisecond):
		}
	}
}
