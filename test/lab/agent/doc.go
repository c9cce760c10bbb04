// Package agent is the lab's node agent: a small stand-in for the kubelet.
//
// It registers a Node, keeps its Lease and status fresh, and runs the pods the
// scheduler binds to it as ordinary processes. The image table maps an image
// to an OCI image layout (unpacked; its entrypoint runs as its user) or to a
// local program standing in for it; pods without hostNetwork get their own network
// namespace behind a veth pair with an address from the node's pod CIDR. The
// agent resolves environment variables, materialises volumes (secret,
// configMap, emptyDir, projected service-account tokens, downwardAPI), runs
// probes, reports pod status and serves the kubelet's /containerLogs and
// /exec endpoints, so `kubectl logs` and `kubectl exec` work.
//
// It is not a container runtime: processes share the host file system (only a
// private mount namespace per container, for the bind-mounted volumes; no
// chroot into the image), and there are no cgroups, resource limits or user
// namespaces.
package agent
