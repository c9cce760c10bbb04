// Package layer2 answers ARP and NDP for the load-balancer IPs this node owns.
//
// An Announcer keeps one responder per eligible network interface. A responder
// reads raw Ethernet frames from an AF_PACKET socket (ARP, and IPv6 for
// Neighbor Discovery), checks the target address against an atomically
// swapped set of owned IPs before doing anything else, and replies with the
// MAC of the interface the request arrived on. Taking over an IP sends
// gratuitous ARP (request and reply) and unsolicited Neighbor Advertisements
// in bursts; losing it stops replies before SetBalancer/DeleteBalancer
// returns. Frames from another MAC claiming an owned IP are reported as
// conflicts.
//
// The package never adds addresses to interfaces and never touches routing:
// traffic to the IPs is handled by kube-proxy.
package layer2
