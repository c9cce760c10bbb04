package main

import (
	"fmt"
	"os"
	"strconv"
	"time"

	"github.com/spf13/cobra"
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/ironlb/ironlb/internal/layer2"
	"github.com/ironlb/ironlb/internal/membership"
	"github.com/ironlb/ironlb/internal/ownership"
	"github.com/ironlb/ironlb/speaker"
)

// envOr returns the environment variable's value, or def when unset. Flags
// take their defaults from MetalLB's environment variables, so the same Pod
// spec works; an explicit flag wins over the environment.
func speakerEnv(name, def string) string {
	if v, ok := os.LookupEnv(name); ok {
		return v
	}
	return def
}

func speakerEnvInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil {
		return v
	}
	return def
}

func newSpeakerCommand() *cobra.Command {
	var (
		o             speaker.Options
		logLevel      string
		metricsPort   int
		healthPort    int
		healthHost    string
		excludeIfaces []string
		ml            = membership.DefaultOptions()
		l2            layer2.Options
		kubeconfig    string
	)
	cmd := &cobra.Command{
		Use:   "speaker",
		Short: "answer ARP/NDP for the Service IPs this node owns",
		Long: `The speaker runs on every node (DaemonSet, hostNetwork, NET_RAW). It joins the other
speakers over memberlist and keeps with them a replica of who owns each Service IP.
Ownership is sticky: a new IP goes to the least-loaded node an L2Advertisement allows,
and an IP moves only when its owner can no longer carry the traffic (its kernel stops
answering ARP/NDP on the segment, the configuration excludes it, or its speaker stays
away longer than --hold-time); it then goes to the hash winner, smallest
sha256(node#ip), among the eligible live nodes. A speaker restart, crash or freeze
moves nothing, and a returning node takes nothing back unless --failback=immediate.
The owner answers ARP (IPv4) and NDP (IPv6) for its IPs, sends gratuitous
announcements on takeover, and keeps ServiceL2Status objects current. Without
memberlist (--disable-memberlist) the hash winner among the Ready nodes announces,
as in MetalLB.

Every flag defaults to the MetalLB environment variable named in its help, so a
MetalLB speaker Pod spec works unchanged.`,
		RunE: func(cmd *cobra.Command, _ []string) error {
			logger, err := newLogger(logLevel)
			if err != nil {
				return err
			}
			ctrl.SetLogger(logger)
			o.Logger = logger
			o.Membership = ml
			o.MetricsBindAddress = hostPort("", metricsPort)
			o.HealthProbeBindAddress = hostPort(healthHost, healthPort)
			if l2.ExcludeInterfaces, err = layer2.CompileExcludes(nonEmpty(excludeIfaces)); err != nil {
				return fmt.Errorf("--exclude-interfaces: %w", err)
			}
			o.Layer2 = l2
			if o.RestConfig, err = restConfig(kubeconfig); err != nil {
				return err
			}
			return speaker.Run(ctrl.SetupSignalHandler(), o)
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.NodeName, "node-name", os.Getenv("METALLB_NODE_NAME"),
		"name of this node (env METALLB_NODE_NAME, from spec.nodeName); also the memberlist member name")
	f.StringVar(&o.HostIP, "host", os.Getenv("METALLB_HOST"),
		"this node's IP (env METALLB_HOST, from status.hostIP); advertised to peers when --ml-bindaddr is a wildcard")
	f.StringVar(&o.Namespace, "namespace", os.Getenv("METALLB_NAMESPACE"),
		"install namespace (env METALLB_NAMESPACE): pools, advertisements, ServiceL2Status and speaker Pods are read there only")
	f.StringVar(&o.PodName, "pod-name", os.Getenv("METALLB_POD_NAME"),
		"this speaker's Pod name (env METALLB_POD_NAME); owner of its ServiceL2Status objects, and skipped in the peer list")
	f.StringVar(&o.LoadBalancerClass, "lb-class", speakerEnv("METALLB_LB_CLASS", ""),
		"handle only Services with this spec.loadBalancerClass; empty handles Services without a class (as MetalLB's --lb-class)")
	f.BoolVar(&o.IgnoreExcludeLB, "ignore-exclude-lb", false,
		"also announce from nodes labelled node.kubernetes.io/exclude-from-external-load-balancers")
	f.StringVar(&kubeconfig, "kubeconfig", "",
		"kubeconfig file; default: $KUBECONFIG if set, else the in-cluster service account, else ~/.kube/config")
	f.StringVar(&logLevel, "log-level", speakerEnv("METALLB_LOG_LEVEL", "info"), "log level: all, debug, info, warn, error or none")
	f.IntVar(&metricsPort, "port", speakerEnvInt("METALLB_METRICS_PORT", 9120),
		"Prometheus metrics port (HTTPS with Kubernetes authentication and authorization unless --metrics-secure=false); 0 disables")
	f.BoolVar(&o.MetricsSecure, "metrics-secure", true, "serve metrics over HTTPS with authn/authz (false: plain HTTP)")
	f.IntVar(&healthPort, "health-probe-port", speakerEnvInt("METALLB_HEALTH_PROBE_PORT", 17472),
		"port of /healthz, /readyz and /status (the snapshot `ironlb status` reads, served to loopback clients only); 0 disables all three")
	f.StringVar(&healthHost, "health-probe-host", "127.0.0.1",
		"address /healthz, /readyz and /status listen on; the speaker shares the node's network, so the default keeps them off the node's other addresses (the kubelet probes 127.0.0.1); empty listens on every address")
	f.BoolVar(&o.EnableHTTP2, "enable-http2", false, "let the metrics server offer HTTP/2; off because of the HTTP/2 stream-reset attacks (CVE-2023-44487, CVE-2023-39325)")

	// memberlist
	f.BoolVar(&o.DisableMemberlist, "disable-memberlist", false,
		"do not run memberlist: candidates are the Nodes whose Ready condition is True, so failover waits for the node lifecycle controller to mark a dead node NotReady (about 40-50 s by default) instead of memberlist's seconds")
	f.StringVar(&o.MLBindAddr, "ml-bindaddr", speakerEnv("METALLB_ML_BIND_ADDR", "0.0.0.0"),
		"memberlist bind address (env METALLB_ML_BIND_ADDR, usually status.podIP = the host IP)")
	f.IntVar(&o.MLBindPort, "ml-bindport", speakerEnvInt("METALLB_ML_BIND_PORT", membership.DefaultPort),
		"memberlist port, UDP and TCP (env METALLB_ML_BIND_PORT)")
	f.StringVar(&o.MLLabels, "ml-labels", speakerEnv("METALLB_ML_LABELS", speaker.DefaultSpeakerLabels),
		"label selector of the speaker Pods whose IPs are the memberlist peers (env METALLB_ML_LABELS)")
	f.StringVar(&o.MLSecretKeyPath, "ml-secret-key-path", os.Getenv("METALLB_ML_SECRET_KEY_PATH"),
		"directory (or file) holding the mounted memberlist Secret's 'secretkey' (env METALLB_ML_SECRET_KEY_PATH); the key encrypts and authenticates memberlist traffic. "+
			"Re-read every 10 s: a rotated Secret takes effect without a restart (the old key still decrypts). Empty: no encryption")
	f.DurationVar(&ml.ProbeInterval, "ml-probe-interval", ml.ProbeInterval,
		"memberlist: each member probes one other member this often; with --ml-suspicion-mult it sets failover time")
	f.DurationVar(&ml.ProbeTimeout, "ml-probe-timeout", ml.ProbeTimeout,
		"memberlist: wait this long for a direct ack before asking other members to probe indirectly (must be < probe interval)")
	f.IntVar(&ml.SuspicionMult, "ml-suspicion-mult", ml.SuspicionMult,
		"memberlist: a suspect member has suspicion-mult x probe-interval (x log10(members) from 10 members) to refute before it is declared dead; "+
			"the default tolerates a node frozen ~500 ms, each step adds ~100 ms to both that and the failover time")
	f.IntVar(&ml.SuspicionMaxTimeoutMult, "ml-suspicion-max-timeout-mult", ml.SuspicionMaxTimeoutMult,
		"memberlist: the suspicion timer starts at this multiple of its minimum and shrinks as other members confirm (false-positive guard)")
	f.IntVar(&ml.IndirectChecks, "ml-indirect-checks", ml.IndirectChecks, "memberlist: members asked to probe a member that missed a direct ack")
	f.DurationVar(&ml.GossipInterval, "ml-gossip-interval", ml.GossipInterval, "memberlist: how often suspect/dead/alive messages are gossiped")
	f.IntVar(&ml.GossipNodes, "ml-gossip-nodes", ml.GossipNodes, "memberlist: members gossiped to per interval")
	f.IntVar(&ml.RetransmitMult, "ml-retransmit-mult", ml.RetransmitMult, "memberlist: each message is retransmitted retransmit-mult x ceil(log10(members+1)) times")
	f.DurationVar(&ml.PushPullInterval, "ml-push-pull-interval", ml.PushPullInterval, "memberlist: full state exchange with a random member this often")
	f.IntVar(&ml.AwarenessMaxMultiplier, "ml-awareness-max-multiplier", ml.AwarenessMaxMultiplier,
		"memberlist: how far a CPU-starved member may stretch its own probe timeouts (Lifeguard) instead of accusing others")
	f.DurationVar(&ml.RejoinInterval, "ml-rejoin-interval", ml.RejoinInterval,
		"re-join speaker Pods that are not members this often (heals partitions)")
	f.DurationVar(&ml.LeaveTimeout, "ml-leave-timeout", ml.LeaveTimeout,
		"on SIGTERM, wait at most this long for the memberlist leave to reach peers (they take over at once)")

	f.DurationVar(&o.LeaveGrace, "leave-grace", 500*time.Millisecond,
		"on SIGTERM, keep answering ARP/NDP this long after leaving the memberlist, so another speaker answers for this node before it goes quiet (pod terminationGracePeriodSeconds must cover ml-leave-timeout + this + a few seconds)")

	// ownership
	f.Var(&failbackFlag{&o.Failback}, "failback",
		"when a node that lost IPs can own them again: 'never' leaves them where they are (established connections survive; new IPs go to the least-loaded node), "+
			"'immediate' moves them back to the hash winner as MetalLB does")
	f.DurationVar(&o.HoldTime, "hold-time", 30*time.Second,
		"how long a node whose speaker is away (restart, crash, freeze) keeps its IPs while its kernel still answers ARP/NDP for its own address; "+
			"another speaker answers for it with its MAC meanwhile. 0: IPs move as soon as the speaker is gone, as in MetalLB")
	f.IntVar(&o.RebalanceRate, "rebalance-rate", 0,
		"how many of its IPs a node may give away per minute to nodes owning at least two fewer, as planned moves (drained: TCP connections do not break), "+
			"so that the spread failures left comes back; 0: never (IPs stay where failures put them; UDP flows would break at a move)")
	f.DurationVar(&o.DrainTimeout, "drain-timeout", speaker.DefaultDrainTimeout,
		"after an IP moved to this node from a node that still delivers (a planned move: a configuration change, the exclude label), how long the TCP connections "+
			"this node did not see start keep going to that node, which holds their state (second chance); new connections are served here at once. 0: such moves reset their connections")

	f.IntVar(&o.KubeProxyHealthPort, "kube-proxy-health-port", speaker.DefaultKubeProxyHealthPort,
		"port of kube-proxy's health endpoint (/healthz) on every node, asked by the node's watchers: a node whose kube-proxy is unhealthy (or whose port is refused) loses its IPs "+
			"and takes none until it has passed for --healthy-after; 0: no health checks, the kernel's ARP/NDP answers alone decide")
	f.DurationVar(&o.HealthyAfter, "healthy-after", speaker.DefaultHealthyAfter,
		"how long a node's kube-proxy health endpoint must pass before the node takes IPs (after it joined, or after a failure)")
	f.BoolVar(&o.ProbeServices, "probe-services", true,
		"with health checks on, the watchers also try a connection to one of each owner's Services through it every 200 ms (a TCP SYN to its IP and first TCP port sent to the owner's MAC, reset at once): "+
			"a kube-proxy restarting with its rules in place moves nothing, a node whose Services' traffic goes nowhere (pod network cut) loses its IPs")

	// layer 2
	f.IntVar(&l2.GratuitousCount, "garp-count", 5,
		"gratuitous ARP / unsolicited NA bursts sent when this node takes over an IP (first at once); negative: none")
	f.DurationVar(&l2.GratuitousInterval, "garp-interval", 1100*time.Millisecond,
		"spacing of the takeover bursts (> 1 s so one lands after old kernels' ARP locktime)")
	f.DurationVar(&l2.RefreshInterval, "garp-refresh-interval", 0,
		"if > 0, repeat a gratuitous burst this often while owning an IP (switches with short FDB ageing)")
	// A StringArray, not a StringSlice: a comma belongs to the expression
	// (^eth{1,3}$) instead of separating two.
	f.StringArrayVar(&excludeIfaces, "exclude-interfaces", layer2.DefaultExcludeInterfaces,
		"regular expression of interface names never announced on; repeat the flag for several (commas are part of the expression). "+
			"Giving the flag replaces the defaults (MetalLB's excludel2 list); empty values are ignored, so --exclude-interfaces= alone excludes nothing")
	return cmd
}

// nonEmpty drops empty flag values: --exclude-interfaces= is how "exclude
// nothing" is written, and an empty expression would match every name.
func nonEmpty(values []string) []string {
	out := make([]string, 0, len(values))
	for _, v := range values {
		if v != "" {
			out = append(out, v)
		}
	}
	return out
}

// failbackFlag parses --failback.
type failbackFlag struct{ v *ownership.Failback }

func (f *failbackFlag) String() string {
	if f.v == nil || *f.v == "" {
		return string(ownership.FailbackNever)
	}
	return string(*f.v)
}

func (f *failbackFlag) Set(s string) error {
	fb, err := ownership.ParseFailback(s)
	if err != nil {
		return err
	}
	*f.v = fb
	return nil
}

func (f *failbackFlag) Type() string { return "never|immediate" }
