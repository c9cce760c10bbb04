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

// mbHealthPort is where TestNetnsKubeProxyHealthHelper serves kube-proxy's
// health endpoint in each node's namespace.
const mbHealthPort = 10256

// TestNetnsKubeProxyHealthHelper stands in for kube-proxy's health server in
// a node's namespace (child process of TestNetnsUnhealthyOwner): /healthz
// answers 200 on the node's address until the process is killed, after
// which the node's kernel refuses the port, as when kube-proxy stops.
func TestNetnsKubeProxyHealthHelper(t *testing.T) {
	addr := os.Getenv("IRONLB_MB_HEALTH_ADDR")
	if addr == "" {
		t.Skip("child process of TestNetnsUnhealthyOwner")
	}
	ln, err := net.Listen("tcp", net.JoinHostPort(addr, strconv.Itoa(mbHealthPort)))
	if err != nil {
		t.Fatal(err)
	}
	_ = http.Serve(ln, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_, _ = w.Write([]byte(`{"healthy":true}`))
	}))
}

// mbStartKubeProxyHealth starts node i's stand-in kube-proxy health server
// and waits until it answers.
func mbStartKubeProxyHealth(tb testing.TB, i int) *exec.Cmd {
	tb.Helper()
	cmd := exec.Command("ip", "netns", "exec", mbPrefix+mbNodes[i], os.Args[0], "-test.run=^TestNetnsKubeProxyHealthHelper$")
	cmd.Env = append(os.Environ(), "IRONLB_MB_HEALTH_ADDR="+mbNodeIP(i))
	if err := cmd.Start(); err != nil {
		tb.Fatalf("start kube-proxy health stand-in on %s: %v", mbNodes[i], err)
	}
	tb.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	end := time.Now().Add(30 * time.Second)
	for {
		out, err := exec.Command("ip", "netns", "exec", mbPrefix+mbNodes[i], "curl", "-sf", "-m", "1",
			"http://"+net.JoinHostPort(mbNodeIP(i), strconv.Itoa(mbHealthPort))+"/healthz").CombinedOutput()
		if err == nil {
			return cmd
		}
		if time.Now().After(end) {
			tb.Fatalf("kube-proxy health stand-in on %s does not answer: %v: %s", mbNodes[i], err, out)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestNetnsUnhealthyOwner: with health checks on, the owner whose
// kube-proxy stops (its health port refused, kernel and speaker alive)
// loses the VIP to the hash winner of the others, which a silent client
// learns from its gratuitous ARP; when kube-proxy is back nothing moves
// back; and an unhealthy node keeps watching others, so the new owner's
// death still moves the VIP (to the only node left healthy). Needs root.
func TestNetnsUnhealthyOwner(t *testing.T) {
	c := newMBCluster(t)
	kp := make([]*exec.Cmd, len(mbNodes))
	for i := range mbNodes {
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

	c.pointAt(t, owner)
	start := time.Now()
	_ = kp[oi].Process.Kill()
	_ = kp[oi].Wait()
	c.neighIs(t, "kube-proxy of "+owner+" stopped", c.macs[next])
	if at, ok := c.ac.firstFrom(c.macs[next], start); ok {
		t.Logf("kube-proxy of %s stopped: %s answered %v later", owner, next, at.Sub(start).Round(time.Millisecond))
	}

	kp[oi] = mbStartKubeProxyHealth(t, oi)
	c.nothingMoves(t, "kube-proxy of "+owner+" back", next, time.Now(), 3*time.Second)

	// The new owner dies hard; owner (healthy again, after 1 s) or the
	// third node takes it: either way not the dead one, and it answers.
	ni := slices.Index(mbNodes, next)
	_ = c.procs[ni].Process.Kill()
	_ = c.procs[ni].Wait()
	c.procs[ni] = nil
	mbRun(t, "ip", "-n", mbPrefix+next, "link", "set", "eth0", "down")
	final := election.Rank(mbVIP, without(mbNodes, next))[0]
	c.neighIs(t, "after "+next+" died", c.macs[final])
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
