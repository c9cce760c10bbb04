// Package secondchance keeps the TCP connections of a LoadBalancer IP alive
// when the IP moves, in a planned way, from one node (the previous owner)
// to another (this node) while the previous owner is still up.
//
// # The problem
//
// Once this node announces the IP, clients send it every packet for the IP,
// including the packets of connections that the previous owner accepted.
// This node has no socket and no conntrack entry for those connections, so
// it resets them (or kube-proxy drops them as invalid).
//
// # The mechanism
//
// A Table is an nftables table of family netdev, "ironlb-sc-<ifname>", with
// one base chain at the ingress hook of the interface the IP is announced
// on. For every forwarded IP (a map from the IP to the previous owner's
// MAC), per IP family:
//
//  1. a TCP SYN without ACK to the IP starts a flow here: its
//     saddr . sport . daddr . dport enters a dynamic "local" set and the
//     packet is accepted;
//  2. a packet of a flow in the local set is accepted (refreshing the
//     flow's timeout);
//  3. every other TCP packet to the IP is recorded in a "forwarded" set
//     (statistics), counted, rewritten at layer 2 (source: this interface's
//     MAC, destination: the previous owner's MAC) and sent back out of the
//     interface it came in on (nft "dup" to the input interface, then
//     "drop"). The IP header and payload are untouched.
//
// The previous owner still has the connection's socket or conntrack/NAT
// entry, so it serves the packet and replies to the client directly, from
// the IP. New connections, whose SYN reaches this node, are served here.
//
// Later calls to Set replace only the map of forwarded IPs, in one atomic
// batch: the local set survives, so a flow this node started serving is
// never sent away later.
//
// # Why it is safe with kube-proxy, in any mode and policy
//
// The ingress hook runs when the driver hands the frame to the stack, before
// any IP-layer netfilter hook: before conntrack, before kube-proxy's
// iptables or nftables rules (whose tables are of family ip, ip6 or inet),
// before routing. A forwarded packet never reaches them on this node, so
// this node's conntrack and kube-proxy state stay as if it never saw the
// packet, and the package works the same with kube-proxy in iptables or
// nftables mode. It does not use conntrack at all.
//
// The previous owner needs nothing special. kube-proxy programs every node
// for every LoadBalancer IP, so the previous owner keeps its rules for the
// IP after the move; the forwarded packets are ordinary packets to the IP
// arriving on its interface with its MAC as destination, which match its
// existing conntrack entries: with externalTrafficPolicy Cluster they are
// DNATed (and SNATed) to the same endpoint as before, and with
// externalTrafficPolicy Local its entries still DNAT to its local
// endpoints, which is where those connections have been going all along.
// Its replies leave as they always did. This node handles only packets that
// the previous owner has state for (those of flows that did not start
// here); flows that started here never leave.
//
// # Limits
//
//   - TCP only. UDP flows cannot be told apart (there is no SYN marking
//     a flow's start), so UDP to a moved IP is served by the new owner.
//   - A flow is recognized as this node's only by its SYN. A flow whose SYN
//     reached the previous owner before the move and whose handshake
//     completes after it is forwarded, which is right; a SYN retransmitted
//     to this node after the previous owner answered the first one starts
//     the flow here, and the client's connection resets.
//   - The local set forgets a flow idle for 10 minutes; its next packet is
//     forwarded to the previous owner, which resets it. The local set holds
//     at most 262144 flows; a flow starting when it is full is forwarded
//     whole (the previous owner serves it) until the forwarding ends. The
//     forwarded set (statistics only) forgets a flow idle for 2 minutes.
//   - Non-first IP fragments carry no TCP header, so they are forwarded even
//     for a local flow. TCP rarely fragments (it sets DF and uses path MTU
//     discovery).
//   - When the forwarding of an IP ends (Set without it), the connections
//     the previous owner still serves reset: the caller picks how long
//     forwarding lasts.
//   - Only frames addressed to this interface's MAC are handled. Programs
//     that take packets before netfilter's ingress hook (tc or XDP
//     programs, as some CNIs install) can bypass the table.
//   - The rules use the interface's MAC as it was when they were written;
//     Set rewrites them when it changed.
//
// The kernel features relied on: nf_tables with the netdev family (ingress
// hook), dynamic sets with timeouts and concatenated keys, maps, named
// counters, payload writes to the link-layer header and the netdev "dup"
// expression (nft_dup_netdev).
//
// The table is created in the network namespace of the calling thread.
package secondchance
