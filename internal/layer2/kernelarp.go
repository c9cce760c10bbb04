package layer2

import (
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/vishvananda/netlink"
)

// KernelARPFix is the remedy named in KernelARPFinding messages.
const KernelARPFix = "set strictARP: true in kube-proxy's config (ipvs.strictARP; it sets net.ipv4.conf.all.arp_ignore=1 and arp_announce=2)"

// KernelARPFinding says the kernel of this node would itself answer ARP for a
// load-balancer IP: the address is configured on a local interface (kube-proxy
// IPVS puts every service IP on kube-ipvs0) and arp_ignore lets the kernel
// reply on an interface that faces clients. Every node would then answer for
// every IP, whoever the elected announcer is.
type KernelARPFinding struct {
	IP           netip.Addr
	ConfiguredOn []string // interfaces carrying the address
	AnswersOn    []string // eligible interfaces where the kernel replies
	Message      string   // for the log and the event, naming the fix
}

// KernelARPFindings checks ips (the IPv4 ones; NDP has no such switch)
// against the node's addresses and arp_ignore settings, over the interfaces
// the announcer would use. It reads netlink and /proc/sys/net/ipv4/conf.
func (a *Announcer) KernelARPFindings(ips []netip.Addr) ([]KernelARPFinding, error) {
	links, err := a.opts.Links()
	if err != nil {
		return nil, err
	}
	addrs, err := netlink.AddrList(nil, netlink.FAMILY_V4)
	if err != nil {
		return nil, fmt.Errorf("listing IPv4 addresses: %w", err)
	}
	names := map[int]string{}
	for _, l := range links {
		names[l.Index] = l.Name
	}
	local := map[netip.Addr][]string{}
	for _, ad := range addrs {
		if ip, ok := netip.AddrFromSlice(ad.IP); ok {
			ip = ip.Unmap()
			local[ip] = append(local[ip], names[ad.LinkIndex])
		}
	}
	var eligible []string
	for _, l := range links {
		if arp, _, _ := eligibility(l, a.opts.ExcludeInterfaces); arp {
			eligible = append(eligible, l.Name)
		}
	}
	return kernelARPFindings(ips, local, eligible, procArpIgnore("/proc/sys/net/ipv4/conf"))
}

// procArpIgnore reads the effective arp_ignore of an interface: the kernel
// uses the larger of conf/all and conf/<if>.
func procArpIgnore(root string) func(string) (int, error) {
	read := func(name string) (int, error) {
		p := filepath.Join(root, name, "arp_ignore")
		b, err := os.ReadFile(p)
		if err != nil {
			return 0, fmt.Errorf("reading %s: %w", p, err)
		}
		v, err := strconv.Atoi(strings.TrimSpace(string(b)))
		if err != nil {
			return 0, fmt.Errorf("parsing %s value %q: %w", p, strings.TrimSpace(string(b)), err)
		}
		return v, nil
	}
	return func(iface string) (int, error) {
		all, err := read("all")
		if err != nil {
			return 0, err
		}
		dev, err := read(iface)
		if err != nil {
			return 0, err
		}
		return max(all, dev), nil
	}
}

// kernelARPFindings is the pure check. local maps each local IPv4 address to
// the interfaces carrying it; eligible are the client-facing interfaces;
// arpIgnore returns an interface's effective arp_ignore. Per ip-sysctl.txt:
// 0 replies for any local address on any interface; 1-3 only for addresses
// configured on the receiving interface; 8 never.
func kernelARPFindings(ips []netip.Addr, local map[netip.Addr][]string, eligible []string, arpIgnore func(string) (int, error)) ([]KernelARPFinding, error) {
	var out []KernelARPFinding
	cache := map[string]int{}
	for _, ip := range ips {
		ip = ip.Unmap()
		on := local[ip]
		if !ip.Is4() || len(on) == 0 {
			continue
		}
		var answers []string
		for _, ifname := range eligible {
			v, ok := cache[ifname]
			if !ok {
				var err error
				if v, err = arpIgnore(ifname); err != nil {
					return nil, err
				}
				cache[ifname] = v
			}
			if v == 0 || (v < 8 && slices.Contains(on, ifname)) {
				answers = append(answers, ifname)
			}
		}
		if len(answers) == 0 {
			continue
		}
		out = append(out, KernelARPFinding{
			IP: ip, ConfiguredOn: slices.Clone(on), AnswersOn: answers,
			Message: fmt.Sprintf("the kernel of this node answers ARP for load-balancer IP %s on %s because the address is configured on %s and arp_ignore allows replies; every node answers, not only the announcer: %s",
				ip, strings.Join(answers, ","), strings.Join(on, ","), KernelARPFix),
		})
	}
	return out, nil
}
