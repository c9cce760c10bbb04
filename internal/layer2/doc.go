// Package layer2 answers ARP and NDP for the load-balancer IPs this node owns.
//
// An Announcer keeps one responder per eligible network interface. A responder
// reads raw Ethernet frames from an AF_PACKET socket (ARP, and IPv6 for
// Neighbor Discovery), checks the target address against an atomically
// swapped set of owned IPs before doing anything else, and replies with the
// MAC of the interface the request arrived on. Taking over an IP sends
// gratuitous ARP (request and reply) and unsolicited Neighbor Advertisements
// in bursts; losing it stops replies before Apply returns. Frames from another MAC claiming an owned IP are reported as
// conflicts.
//
// An Announcer also answers, never announces, the IPs of another host on its
// behalf (SetProxy): the replies carry that host's MAC in the ARP or NDP
// payload and this node's MAC as Ethernet source, so switches keep learning
// each MAC from its own port. A Prober tells whether another host's kernel
// still answers for its own address on the segment (RFC 5227 ARP probes,
// Neighbor Solicitations), to decide whether that host can still carry
// traffic. File layout: announcer.go keeps the owned set and the
// responders' lifecycle, gratuitous.go the announcement scheduler,
// conflict.go the conflict policy, proxy.go the proxy entries, responder.go
// the per-frame policy, prober.go the Prober (ARP/NDP: is a node's kernel
// alive), synprobe.go the SYNProber (does a node deliver a Service: a TCP SYN
// to VIP:port sent to its MAC, answered by a SYN-ACK, then reset).
//
// The package never adds addresses to interfaces and never touches routing:
// traffic to the IPs is handled by kube-proxy.
package layer2
