// Package ownership decides which node owns (announces) each Service IP, and
// keeps that decision sticky: an IP moves only when its owner can no longer
// carry the traffic, never because a speaker process restarted.
//
// The model, in one place:
//
//   - A key is a Service's first ingress IP; every IP of the Service (and
//     every Service sharing that IP) follows the key.
//   - The owner of a key is recorded in a Claim {key, owner, epoch}. Every
//     speaker holds a replica of all claims and gossips it over memberlist.
//     Two claims for one key merge deterministically: the higher epoch wins,
//     equal epochs are ordered by hash (Newer), so replicas converge without
//     a consensus round and without the API server.
//   - A claim changes only by a transition computed by the same pure rule on
//     every speaker (Engine.decide), which bumps the epoch by one. Speakers
//     that see the same inputs compute the same transition, so the new owner
//     acts at once on its own computation and gossip only repairs replicas
//     that saw different inputs (or restarted).
//   - The current owner keeps a key while it serves: its data path is not
//     known to be down (its kernel still answers ARP/NDP for its own address
//     on the segment) and its speaker is alive or has been away for less
//     than the hold time. A speaker restart, crash or freeze therefore moves
//     nothing; another speaker (the deputy) answers ARP/NDP on the owner's
//     behalf meanwhile.
//   - Keys without a serving owner are placed: a new key on the least-loaded
//     eligible node, a key whose owner failed on the hash winner (smallest
//     sha256(node#key)) among the eligible live nodes. Both choose among the
//     nodes of the highest preference score first (NodeSet.Score, from
//     preferredNodeSelectors), falling back to lower scores when none of
//     those can take the key. A node that returns takes nothing back unless
//     Failback is Immediate, which keeps MetalLB's rule (the winner, highest
//     score then hash, always owns).
//
// The Engine is pure: no goroutines, no clock, no I/O. Every input (keys and
// their eligible nodes, speaker liveness, data-path verdicts, merged claims,
// the time) is a method call returning the ownership changes it caused, and
// the work per call is proportional to the keys it can affect.
package ownership
