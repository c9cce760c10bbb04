// Package statuscmd is `kubectl ironlb status` (also `ironlb status`): it
// runs `ironlb status --local` in every speaker Pod through the exec
// subresource, which prints that speaker's snapshot (GET /status on its
// loopback health server), merges the snapshots (internal/statusview) and
// prints the report. Nothing is recomputed here: the speakers say what they
// see.
package statuscmd

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/remotecommand"
	"k8s.io/streaming/pkg/httpstream"
	"sigs.k8s.io/yaml"

	"github.com/ironlb/ironlb/internal/statusview"
)

// Defaults that match the chart (and MetalLB's speaker Pod spec).
const (
	DefaultNamespace  = "metallb-system"
	DefaultContainer  = "speaker"
	DefaultHealthPort = 17472
	// DefaultSelector selects the speaker Pods of any release name in the
	// install namespace.
	DefaultSelector = "app.kubernetes.io/component=speaker"
	// speakerBinary is the image's entrypoint, run when the container
	// sets no command of its own.
	speakerBinary = "/ironlb"
	// parallelExecs bounds the exec sessions open at once.
	parallelExecs = 10
)

// ExitError carries the command's exit code: 1 when the report found a
// problem, 2 when the status could not be read at all.
type ExitError struct {
	Code int
	Err  error
}

func (e *ExitError) Error() string { return e.Err.Error() }
func (e *ExitError) Unwrap() error { return e.Err }

// ExitCode returns the process exit code for err (nil: 0; an ExitError:
// its code; anything else: 1).
func ExitCode(err error) int {
	var ee *ExitError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &ee):
		return ee.Code
	}
	return 1
}

type options struct {
	kubeconfig, kubeContext, namespace string
	ironlbNamespace, selector          string
	container, output                  string
	timeout                            time.Duration
	local, segment                     bool
	address                            string
}

// NewCommand returns the status command.
func NewCommand() *cobra.Command {
	o := options{}
	cmd := &cobra.Command{
		Use:   "status [SERVICE | NAMESPACE/SERVICE | IP]",
		Short: "Show who announces each LoadBalancer IP, and why the other nodes do not, as the speakers see it",
		Long: `status asks every speaker what it sees and merges the answers: for each LoadBalancer
Service (or the one Service or IP given) the announcing node, every node in election
order with the reason it does not announce (not a memberlist member, excluded by label,
not selected by an L2Advertisement, no local endpoint with externalTrafficPolicy Local,
interface missing, data path down, held...), the speakers' memberlist views and whether
they agree, and the recent owner changes with their cause.

It runs "ironlb status --local" in each speaker Pod (pods/exec), which reads the
speaker's snapshot from its health server on 127.0.0.1. RBAC: get/list pods and create
pods/exec in the install namespace (the chart's ClusterRole <release>:status-reader,
bound with a RoleBinding there).

Exit code: 0 all well; 1 a problem was found (no announcer for an IP that has
candidates, several announcers, speakers disagreeing on the owner, an address conflict,
the announcer missing its interfaces, split memberlist views, a speaker that cannot be
read); 2 the status could not be read.`,
		Args:          cobra.MaximumNArgs(1),
		SilenceUsage:  true,
		SilenceErrors: true,
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx, cancel := context.WithTimeout(cmd.Context(), o.timeout)
			defer cancel()
			if o.local {
				if err := runLocal(ctx, o.address, args, o.segment, cmd.OutOrStdout()); err != nil {
					return &ExitError{Code: 2, Err: err}
				}
				return nil
			}
			return run(ctx, o, args, cmd.OutOrStdout())
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.kubeconfig, "kubeconfig", "", "kubeconfig file (default: $KUBECONFIG, then ~/.kube/config)")
	f.StringVar(&o.kubeContext, "context", "", "kubeconfig context (default: the current one)")
	f.StringVarP(&o.namespace, "namespace", "n", "", "namespace of a SERVICE given without one (default: the context's, else default)")
	f.StringVar(&o.ironlbNamespace, "ironlb-namespace", DefaultNamespace, "namespace ironlb is installed in (its speaker Pods)")
	f.StringVarP(&o.selector, "selector", "l", DefaultSelector, "label selector of the speaker Pods")
	f.StringVar(&o.container, "container", DefaultContainer, "the speaker's container in its Pod")
	f.StringVarP(&o.output, "output", "o", "table", "output format: table, json or yaml")
	f.DurationVar(&o.timeout, "timeout", 30*time.Second, "give up after this long")
	f.BoolVar(&o.local, "local", false, "print this speaker's own snapshot as JSON (run inside the speaker's container; what the plugin execs)")
	f.StringVar(&o.address, "address", net.JoinHostPort("127.0.0.1", strconv.Itoa(DefaultHealthPort)), "with --local: the speaker's health server")
	f.BoolVar(&o.segment, "segment", true, "also ask the segment who answers for each announced IP (each speaker probes its own, broadcast; another host answering is a conflict)")
	return cmd
}

// parseTarget turns the optional argument into a filter: an IP address, a
// namespace/name, or a name in namespace ns.
func parseTarget(args []string, ns string) (statusview.Filter, error) {
	if len(args) == 0 || args[0] == "" {
		return statusview.Filter{}, nil
	}
	a := args[0]
	if ip, err := netip.ParseAddr(a); err == nil {
		return statusview.Filter{IP: ip.Unmap().String()}, nil
	}
	if strings.Count(a, "/") > 1 || strings.HasPrefix(a, "/") || strings.HasSuffix(a, "/") {
		return statusview.Filter{}, fmt.Errorf("argument %q: want SERVICE, NAMESPACE/SERVICE or an IP address", a)
	}
	if !strings.Contains(a, "/") {
		a = ns + "/" + a
	}
	return statusview.Filter{Service: a}, nil
}

// runLocal prints the snapshot of the speaker whose health server is at
// address (inside the speaker's container).
func runLocal(ctx context.Context, address string, args []string, segment bool, out io.Writer) error {
	f, err := parseTarget(args, "default")
	if err != nil {
		return err
	}
	q := url.Values{}
	if segment {
		q.Set("segment", "1")
	}
	if f.Service != "" {
		q.Set("service", f.Service)
	}
	if f.IP != "" {
		q.Set("ip", f.IP)
	}
	u := url.URL{Scheme: "http", Host: address, Path: statusview.Path, RawQuery: q.Encode()}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return fmt.Errorf("--address %q: %w", address, err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("reading the speaker's status: %w", err)
	}
	defer func() { _ = resp.Body.Close() }() // read in full below
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return fmt.Errorf("reading the speaker's status from %s: %w", u.String(), err)
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: HTTP %d: %s", u.String(), resp.StatusCode, bytes.TrimSpace(body))
	}
	_, err = out.Write(body)
	return err
}

// run reads every speaker's snapshot, merges them and prints the report.
func run(ctx context.Context, o options, args []string, out io.Writer) error {
	fail := func(err error) error { return &ExitError{Code: 2, Err: err} }
	if !slices.Contains([]string{"table", "json", "yaml"}, o.output) {
		return fail(fmt.Errorf("--output %q: want table, json or yaml", o.output))
	}
	loader := kubeconfigLoader(o.kubeconfig, o.kubeContext)
	cfg, err := loader.ClientConfig()
	if err != nil {
		return fail(fmt.Errorf("kubeconfig: %w", err))
	}
	ns := o.namespace
	if ns == "" {
		if ns, _, err = loader.Namespace(); err != nil || ns == "" {
			ns = "default"
		}
	}
	filter, err := parseTarget(args, ns)
	if err != nil {
		return fail(err)
	}
	filter.Segment = o.segment
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return fail(err)
	}
	report, err := speakerReport(ctx, cfg, cs, o.ironlbNamespace, o.selector, o.container, filter)
	if err != nil {
		return fail(err)
	}
	if err := write(out, o.output, report); err != nil {
		return fail(err)
	}
	if n := len(report.Problems); n > 0 {
		return &ExitError{Code: 1, Err: fmt.Errorf("%d problem(s) found", n)}
	}
	return nil
}

func write(out io.Writer, format string, r statusview.Report) error {
	switch format {
	case "json":
		b, err := json.MarshalIndent(r, "", "  ")
		if err != nil {
			return err
		}
		_, err = fmt.Fprintf(out, "%s\n", b)
		return err
	case "yaml":
		b, err := yaml.Marshal(r)
		if err != nil {
			return err
		}
		_, err = out.Write(b)
		return err
	}
	return statusview.WriteTable(out, r)
}

// speakerReport reads the snapshot of every speaker Pod (namespace ns,
// labels selector) and merges them.
func speakerReport(ctx context.Context, cfg *rest.Config, cs kubernetes.Interface, ns, selector, container string, f statusview.Filter) (statusview.Report, error) {
	pods, err := cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: selector})
	if err != nil {
		return statusview.Report{}, fmt.Errorf("listing the speaker Pods (namespace %s, labels %s): %w", ns, selector, err)
	}
	if len(pods.Items) == 0 {
		return statusview.Report{}, fmt.Errorf("no speaker Pods in namespace %s with labels %s (--ironlb-namespace, --selector)", ns, selector)
	}
	return statusview.Merge(time.Now().UTC(), readSpeakers(ctx, cfg, cs, pods.Items, container, f)), nil
}

// readSpeakers execs the local status command in every speaker Pod, at
// most parallelExecs at a time.
func readSpeakers(ctx context.Context, cfg *rest.Config, cs kubernetes.Interface, pods []corev1.Pod, container string, f statusview.Filter) []statusview.Source {
	out := make([]statusview.Source, len(pods))
	sem := make(chan struct{}, parallelExecs)
	var wg sync.WaitGroup
	for i := range pods {
		p := &pods[i]
		out[i] = statusview.Source{Node: p.Spec.NodeName, Pod: p.Name}
		argv, err := localCommand(p, container, f)
		if err != nil {
			out[i].Err = err.Error()
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			snap, err := execSnapshot(ctx, cfg, cs, p, container, argv)
			if err != nil {
				out[i].Err = err.Error()
				return
			}
			out[i].Snapshot = snap
		}()
	}
	wg.Wait()
	return out
}

// localCommand is the command that prints a speaker Pod's snapshot: its
// binary with `status --local`, the health server's address taken from
// the container's flags or environment, and the filter.
func localCommand(p *corev1.Pod, container string, f statusview.Filter) ([]string, error) {
	if p.Status.Phase != corev1.PodRunning || p.DeletionTimestamp != nil {
		return nil, fmt.Errorf("pod is %s, not running", podPhase(p))
	}
	i := slices.IndexFunc(p.Spec.Containers, func(c corev1.Container) bool { return c.Name == container })
	if i < 0 {
		return nil, fmt.Errorf("pod has no container %q (--container)", container)
	}
	c := p.Spec.Containers[i]
	addr, err := healthAddress(c)
	if err != nil {
		return nil, err
	}
	bin := speakerBinary
	if len(c.Command) > 0 {
		bin = c.Command[0]
	}
	argv := []string{bin, "status", "--local", "--address", addr}
	if !f.Segment {
		// Only when off: a speaker of the previous release has no such
		// flag, and --local asks the segment by default.
		argv = append(argv, "--segment=false")
	}
	switch {
	case f.Service != "":
		argv = append(argv, f.Service)
	case f.IP != "":
		argv = append(argv, f.IP)
	}
	return argv, nil
}

func podPhase(p *corev1.Pod) string {
	if p.DeletionTimestamp != nil {
		return "terminating"
	}
	return string(p.Status.Phase)
}

// healthAddress finds where a speaker container's health server listens:
// --health-probe-host and --health-probe-port in its command or args, else
// METALLB_HEALTH_PROBE_PORT, else the defaults (127.0.0.1:17472). A server
// on every address ("") is reached on 127.0.0.1.
func healthAddress(c corev1.Container) (string, error) {
	host, port := "127.0.0.1", strconv.Itoa(DefaultHealthPort)
	for _, e := range c.Env {
		if e.Name == "METALLB_HEALTH_PROBE_PORT" && e.Value != "" {
			port = e.Value
		}
	}
	argv := append(slices.Clone(c.Command), c.Args...)
	for i, a := range argv {
		for _, fl := range []struct {
			name string
			dst  *string
		}{{"--health-probe-port", &port}, {"--health-probe-host", &host}} {
			switch {
			case strings.HasPrefix(a, fl.name+"="):
				*fl.dst = strings.TrimPrefix(a, fl.name+"=")
			case a == fl.name && i+1 < len(argv):
				*fl.dst = argv[i+1]
			}
		}
	}
	if n, err := strconv.Atoi(port); err != nil || n <= 0 || n > 65535 {
		return "", fmt.Errorf("container %s: health probe port %q: the speaker's health server (which serves its status) is disabled or unreadable", c.Name, port)
	}
	if host == "" || host == "0.0.0.0" || host == "::" {
		host = "127.0.0.1"
	}
	return net.JoinHostPort(host, port), nil
}

// execSnapshot runs argv in the Pod's container and decodes the snapshot
// it prints.
func execSnapshot(ctx context.Context, cfg *rest.Config, cs kubernetes.Interface, p *corev1.Pod, container string, argv []string) (*statusview.Snapshot, error) {
	req := cs.CoreV1().RESTClient().Post().Resource("pods").Namespace(p.Namespace).Name(p.Name).SubResource("exec").
		VersionedParams(&corev1.PodExecOptions{Container: container, Command: argv, Stdout: true, Stderr: true}, scheme.ParameterCodec)
	// As kubectl exec: WebSocket first, SPDY where the API server or a
	// proxy cannot upgrade to it.
	ws, err := remotecommand.NewWebSocketExecutor(cfg, http.MethodGet, req.URL().String())
	if err != nil {
		return nil, fmt.Errorf("exec: %w", err)
	}
	spdy, err := remotecommand.NewSPDYExecutor(cfg, http.MethodPost, req.URL())
	if err != nil {
		return nil, fmt.Errorf("exec: %w", err)
	}
	ex, err := remotecommand.NewFallbackExecutor(ws, spdy, func(err error) bool {
		return httpstream.IsUpgradeFailure(err) || httpstream.IsHTTPSProxyError(err)
	})
	if err != nil {
		return nil, fmt.Errorf("exec: %w", err)
	}
	var stdout, stderr bytes.Buffer
	if err := ex.StreamWithContext(ctx, remotecommand.StreamOptions{Stdout: &stdout, Stderr: &stderr}); err != nil {
		msg := strings.TrimSpace(stderr.String())
		if msg == "" {
			msg = "(no output)"
		}
		return nil, fmt.Errorf("exec %s: %w: %s", strings.Join(argv, " "), err, msg)
	}
	return decodeSnapshot(stdout.Bytes())
}

// decodeSnapshot parses a speaker's snapshot, refusing another schema
// version rather than misreading it.
func decodeSnapshot(b []byte) (*statusview.Snapshot, error) {
	var s statusview.Snapshot
	if err := json.Unmarshal(b, &s); err != nil {
		return nil, fmt.Errorf("the speaker's status does not parse as JSON: %w", err)
	}
	if s.SchemaVersion != statusview.SchemaVersion {
		return nil, fmt.Errorf("the speaker's status has schemaVersion %d, this command reads %d: use the kubectl-ironlb of the installed ironlb version",
			s.SchemaVersion, statusview.SchemaVersion)
	}
	return &s, nil
}

// Main runs root and exits with the status command's exit code: the shared
// main of cmd/ironlb and cmd/kubectl-ironlb.
func Main(root *cobra.Command, prefix string) {
	err := root.Execute()
	if err != nil {
		fmt.Fprintln(os.Stderr, prefix+":", err)
	}
	os.Exit(ExitCode(err))
}
