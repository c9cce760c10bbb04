package speaker

import (
	"net"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/ironlb/ironlb/internal/election"
)

// In TestNetnsUnhealthyOwner each node's namespace stands in for what
// kube-proxy gives a node: its health endpoint on mbHealthPort (a process of
// its own, TestNetnsStandInHelper, so that it can die alone), and the
// Service's data path: the VIP on the node's loopback with a server on
// mbServicePort (the kernel accepts the VIP's packets, as kube-proxy's rules
// make it do; arp_ignore=1 keeps the kernel from answering ARP for it).
// Removing the VIP from the loopback is kube-proxy's rules flushed.
const (
	mbHealthPort  = 10256
	mbServicePort = 80
)

// TestNetnsStandInHelper serves, in a node's namespace, kube-proxy's health
// endpoint on IRONLB_MB_HEALTH_ADDR, or a Service's backend on
// IRONLB_MB_SERVICE_ADDR (child process of TestNetnsUnhealthyOwner), until
// it is killed.
func TestNetnsStandInHelper(t *testing.T) {
	addr := net.JoinHostPort(os.Getenv("IRONLB_MB_HEALTH_ADDR"), strconv.Itoa(mbHealthPort))
	if a := os.Getenv("IRONLB_MB_SERVICE_ADDR"); a != "" {
		addr = net.JoinHostPort(a, strconv.Itoa(mbServicePort))
	} else if os.Getenv("IRONLB_MB_HEALTH_ADDR") == "" {
		t.Skip("child process of TestNetnsUnhealthyOwner")
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	_ = http.Serve(ln, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_, _ = w.Write([]byte(`{"healthy":true}`))
	}))
}

// mbStartStandIn starts node i's stand-in (env: IRONLB_MB_HEALTH_ADDR or
// IRONLB_MB_SERVICE_ADDR) and waits until url answers in its namespace.
func mbStartStandIn(tb testing.TB, i int, env, url string) *exec.Cmd {
	tb.Helper()
	cmd := exec.Command("ip", "netns", "exec", mbPrefix+mbNodes[i], os.Args[0], "-test.run=^TestNetnsStandInHelper$")
	cmd.Env = append(os.Environ(), env)
	if err := cmd.Start(); err != nil {
		tb.Fatalf("start stand-in %s on %s: %v", env, mbNodes[i], err)
	}
	tb.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	end := time.Now().Add(30 * time.Second)
	for {
		out, err := exec.Command("ip", "netns", "exec", mbPrefix+mbNodes[i], "curl", "-sf", "-m", "1", url).CombinedOutput()
		if err == nil {
			return cmd
		}
		if time.Now().After(end) {
			tb.Fatalf("stand-in %s on %s does not answer %s: %v: %s", env, mbNodes[i], url, err, out)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func mbStartKubeProxyHealth(tb testing.TB, i int) *exec.Cmd {
	return mbStartStandIn(tb, i, "IRONLB_MB_HEALTH_ADDR="+mbNodeIP(i),
		"http://"+net.JoinHostPort(mbNodeIP(i), strconv.Itoa(mbHealthPort))+"/healthz")
}

// mbServiceRules gives node i the Service's data path (up) or takes it away.
func mbServiceRules(tb testing.TB, i int, up bool) {
	tb.Helper()
	op := "del"
	if up {
		op = "add"
	}
	mbRun(tb, "ip", "-n", mbPrefix+mbNodes[i], "addr", op, mbVIP+"/32", "dev", "lo")
}

// TestNetnsUnhealthyOwner runs the speakers with health checks on (node
// helpers with IRONLB_MB_HEALTH_PORT: kube-proxy's endpoint asked, the
// Service tried through the owner, healthy after 1 s) and checks what a
// client sees:
//  1. the owner's kube-proxy dies with its rules in place (a restart):
//     its Service is still delivered through it, nothing moves;
//  2. its rules go too: the VIP moves to the hash winner of the others,
//     which a silent client learns from the gratuitous ARP;
//  3. both come back: nothing moves back;
//  4. the new owner's Service traffic goes nowhere while its kube-proxy
//     answers healthy (a pod network cut): the VIP moves once the
//     watchers' tries through it fail and through another node succeed.
//
// Needs root.
func TestNetnsUnhealthyOwner(t *testing.T) {
	c := newMBCluster(t)
	kp := make([]*exec.Cmd, len(mbNodes))
	for i, n := range mbNodes {
		for _, k := range []string{"all", "eth0", "lo"} {
			mbRun(t, "ip", "netns", "exec", mbPrefix+n, "sysctl", "-qw", "net.ipv4.conf."+k+".arp_ignore=1")
		}
		mbServiceRules(t, i, true)
		mbStartStandIn(t, i, "IRONLB_MB_SERVICE_ADDR="+mbVIP, "http://"+mbVIP+"/")
		kp[i] = mbStartKubeProxyHealth(t, i)
	}
	c.startNodes(t, "IRONLB_MB_HEALTH_PORT="+strconv.Itoa(mbHealthPort))
	c.startProbe(t)
	c.waitStable(t, c.ac)
	// Every node takes IPs only once found healthy for 1 s (RequireUp): the
	// owner is one; wait until the others are too, so that what follows
	// measures the move, not their start.
	c.waitAllUp(t)
	owner, oi := c.owner, c.ownerIdx
	next := election.Rank(mbVIP, without(mbNodes, owner))[0]

	_ = kp[oi].Process.Kill()
	_ = kp[oi].Wait()
	c.nothingMoves(t, "kube-proxy of "+owner+" stopped, its rules in place", owner, time.Now(), 3*time.Second)

	c.pointAt(t, owner)
	start := time.Now()
	mbServiceRules(t, oi, false)
	c.neighIs(t, "kube-proxy of "+owner+" stopped and its rules flushed", c.macs[next])
	if at, ok := c.ac.firstFrom(c.macs[next], start); ok {
		t.Logf("rules of %s flushed, its kube-proxy stopped: %s answered %v later", owner, next, at.Sub(start).Round(time.Millisecond))
	}

	mbServiceRules(t, oi, true)
	kp[oi] = mbStartKubeProxyHealth(t, oi)
	c.nothingMoves(t, "kube-proxy of "+owner+" back", next, time.Now(), 3*time.Second)

	ni := slices.Index(mbNodes, next)
	final := election.Rank(mbVIP, without(mbNodes, next))[0]
	c.pointAt(t, next)
	start = time.Now()
	mbServiceRules(t, ni, false)
	c.neighIs(t, "the Service's traffic through "+next+" goes nowhere, its kube-proxy healthy", c.macs[final])
	if at, ok := c.ac.firstFrom(c.macs[final], start); ok {
		t.Logf("data path of %s's Service cut behind a healthy kube-proxy: %s answered %v later", next, final, at.Sub(start).Round(time.Millisecond))
	}
}

// verdictRE picks a watcher's verdict on a node out of its log.
var verdictRE = regexp.MustCompile(`"msg"="data path of node" "node"="([^"]+)" "verdict"="([^"]+)"`)

// waitAllUp waits until every node's latest verdict on each node it
// watches, as its log says, is up.
func (c *mbCluster) waitAllUp(t *testing.T) {
	t.Helper()
	end := time.Now().Add(30 * time.Second)
	for {
		last := map[string]string{}
		for _, w := range mbNodes {
			b, _ := os.ReadFile(mbLogDir + "/" + w + ".log")
			for _, m := range verdictRE.FindAllStringSubmatch(string(b), -1) {
				last[w+"->"+m[1]] = m[2]
			}
		}
		up := 0
		for _, v := range last {
			if v == "up" {
				up++
			}
		}
		if up == len(mbNodes)*(len(mbNodes)-1) {
			return
		}
		if time.Now().After(end) {
			c.fail(t, "not every watcher found every node up within 30 s: %v", last)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
