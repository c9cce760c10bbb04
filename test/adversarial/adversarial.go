// Package adversarial is a corpus of bad and borderline objects (cases/*.yaml) and
// a runner that sends them through a real API server with ironlb's webhook and
// controller behind it, checking that each is refused with a message naming the
// object, the field and the value, or accepted, or answered with an event on the
// Service. The envtest suite of this package runs it; the e2e suite can run the same
// corpus against the lab with Run.
//
// A case file is a YAML list of cases:
//
//   - name: v6-default-route                 # unique in the corpus
//     setup: [<object>, ...]                 # created first, must be accepted
//     object: <object>                       # the object under test
//     want: reject | accept | event          # what must happen to it
//     contains: ["...", ...]                 # substrings of the error, the warnings or the event note
//     reason: AllocationFailed               # want: event only: the event's reason
//
// Objects of group metallb.io without a namespace go to the install namespace,
// Services without one to the Service namespace. Before decoding, these texts are
// replaced: ${INSTALL_NS}, ${SERVICE_NS}, ${SERVICE_CIDR} (the first CIDR of the
// first ServiceCIDR), ${POD_CIDR} (the first spec.podCIDRs entry of the first node
// that has one), ${LONG} (64 KiB of garbage).
//
// The corpus is meant to be safe on a live cluster such as the lab: its objects have
// names of their own, its pools do not auto-assign (Services name them or their
// addresses), and the advertisements it accepts name a pool that does not exist or
// select pools by a label no real pool has. Cases run one at a time; each deletes
// what it created.
package adversarial

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/ironlb/ironlb/internal/textlimit"
)

// Case is one entry of the corpus.
type Case struct {
	Name     string           `json:"name"`
	File     string           `json:"-"`
	Setup    []map[string]any `json:"setup,omitempty"`
	Object   map[string]any   `json:"object"`
	Want     string           `json:"want"`
	Contains []string         `json:"contains,omitempty"`
	Reason   string           `json:"reason,omitempty"`
}

// What a case can want.
const (
	WantReject = "reject"
	WantAccept = "accept"
	WantEvent  = "event"
)

// Env is the cluster the corpus runs against.
type Env struct {
	// Config reaches the API server with the rights to create, read and delete
	// pools, advertisements, Services and events.
	Config *rest.Config
	// InstallNS is ironlb's namespace; ServiceNS an existing other namespace the
	// Services are created in.
	InstallNS, ServiceNS string
	// Timeout bounds the wait for an event or a deletion (default 30s).
	Timeout time.Duration
}

// Load reads every cases/*.yaml file of dir, in name order, checking that each case
// is well formed and that names are unique.
func Load(dir string) ([]Case, error) {
	files, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
	if err != nil {
		return nil, err
	}
	if len(files) == 0 {
		return nil, fmt.Errorf("no *.yaml case files in %s", dir)
	}
	seen := map[string]string{}
	var all []Case
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return nil, err
		}
		var cases []Case
		if err := yaml.UnmarshalStrict(b, &cases); err != nil {
			return nil, fmt.Errorf("%s: %w", f, err)
		}
		for i := range cases {
			c := &cases[i]
			c.File = filepath.Base(f)
			switch {
			case c.Name == "":
				return nil, fmt.Errorf("%s: case %d has no name", f, i)
			case seen[c.Name] != "":
				return nil, fmt.Errorf("%s: case %q also in %s", f, c.Name, seen[c.Name])
			case c.Object == nil:
				return nil, fmt.Errorf("%s: case %q has no object", f, c.Name)
			case !slices.Contains([]string{WantReject, WantAccept, WantEvent}, c.Want):
				return nil, fmt.Errorf("%s: case %q: want %q is not reject, accept or event", f, c.Name, c.Want)
			case (c.Want == WantEvent) != (c.Reason != ""):
				return nil, fmt.Errorf("%s: case %q: reason is required with want: event, and only then", f, c.Name)
			case c.Want == WantReject && len(c.Contains) == 0:
				return nil, fmt.Errorf("%s: case %q: a rejection must say which message it expects (contains)", f, c.Name)
			}
			seen[c.Name] = c.File
		}
		all = append(all, cases...)
	}
	return all, nil
}

// Run runs every case as a subtest, one after another: each creates its setup and
// object, checks the outcome and deletes what it created before the next begins.
func Run(t *testing.T, env Env, cases []Case) {
	t.Helper()
	if env.Timeout == 0 {
		env.Timeout = 30 * time.Second
	}
	warnings := &warningLog{}
	cfg := rest.CopyConfig(env.Config)
	cfg.WarningHandler = warnings
	c, err := client.New(cfg, client.Options{})
	if err != nil {
		t.Fatalf("client: %v", err)
	}
	vars, err := variables(context.Background(), c, env, cases)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range cases {
		t.Run(tc.File+"/"+tc.Name, func(t *testing.T) {
			r := &runner{t: t, c: c, env: env, vars: vars, warnings: warnings}
			r.run(&tc)
		})
	}
}

type runner struct {
	t        *testing.T
	c        client.Client
	env      Env
	vars     *strings.Replacer
	warnings *warningLog
	created  []*unstructured.Unstructured
}

func (r *runner) run(tc *Case) {
	ctx := context.Background()
	defer r.cleanup(ctx)
	for i, raw := range tc.Setup {
		obj := r.object(raw)
		if err := r.create(ctx, obj); err != nil {
			r.t.Fatalf("setup object %d (%s %s) refused: %v", i, obj.GetKind(), obj.GetName(), err)
		}
		if obj.GetKind() == "Service" {
			r.waitIP(ctx, obj)
		}
	}
	obj := r.object(tc.Object)
	r.warnings.reset()
	err := r.create(ctx, obj)
	what := fmt.Sprintf("%s %s/%s", obj.GetKind(), obj.GetNamespace(), obj.GetName())
	switch tc.Want {
	case WantReject:
		if err == nil {
			r.t.Fatalf("%s was accepted, want it refused with %q", what, tc.Contains)
		}
		r.contains("the error", err.Error(), tc.Contains)
		if n := len(err.Error()); n > 8192 {
			r.t.Errorf("the error has %d bytes: user text is not bounded", n)
		}
	case WantAccept:
		if err != nil {
			r.t.Fatalf("%s refused: %v", what, err)
		}
		r.contains("the warnings", strings.Join(r.warnings.get(), "\n"), tc.Contains)
	case WantEvent:
		if err != nil {
			r.t.Fatalf("%s refused: %v", what, err)
		}
		r.waitEvent(ctx, obj, tc)
	}
}

// object substitutes the variables in a copy of raw and defaults the namespace.
func (r *runner) object(raw map[string]any) *unstructured.Unstructured {
	u := &unstructured.Unstructured{Object: r.substitute(raw).(map[string]any)}
	if u.GetNamespace() == "" {
		if strings.HasPrefix(u.GetAPIVersion(), "metallb.io/") {
			u.SetNamespace(r.env.InstallNS)
		} else {
			u.SetNamespace(r.env.ServiceNS)
		}
	}
	return u
}

// substitute replaces the variables in every string of a decoded YAML value (not
// in the YAML text: a value may contain quotes and backslashes).
func (r *runner) substitute(v any) any {
	switch v := v.(type) {
	case string:
		return r.vars.Replace(v)
	case map[string]any:
		out := make(map[string]any, len(v))
		for k, x := range v {
			out[r.vars.Replace(k)] = r.substitute(x)
		}
		return out
	case []any:
		out := make([]any, len(v))
		for i, x := range v {
			out[i] = r.substitute(x)
		}
		return out
	}
	return v
}

func (r *runner) create(ctx context.Context, obj *unstructured.Unstructured) error {
	err := r.c.Create(ctx, obj)
	if err == nil {
		r.created = append(r.created, obj)
	}
	return err
}

func (r *runner) contains(where, text string, want []string) {
	r.t.Helper()
	for _, w := range r.expand(want) {
		if !strings.Contains(text, w) {
			r.t.Errorf("%s does not contain %q:\n%s", where, w, textlimit.Note(text, 4096))
		}
	}
}

func (r *runner) waitIP(ctx context.Context, obj *unstructured.Unstructured) {
	r.t.Helper()
	var svc corev1.Service
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, r.env.Timeout, true, func(ctx context.Context) (bool, error) {
		if err := r.c.Get(ctx, client.ObjectKeyFromObject(obj), &svc); err != nil {
			return false, err
		}
		return len(svc.Status.LoadBalancer.Ingress) > 0, nil
	})
	if err != nil {
		r.t.Fatalf("setup Service %s got no IP: %v\n%s", obj.GetName(), err, r.events(ctx, obj))
	}
}

// waitEvent waits for an event of the case's reason on obj whose note holds every
// expected text, and checks that every event on obj fits the API's limit.
func (r *runner) waitEvent(ctx context.Context, obj *unstructured.Unstructured, tc *Case) {
	r.t.Helper()
	var found bool
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, r.env.Timeout, true, func(ctx context.Context) (bool, error) {
		var list corev1.EventList
		if err := r.c.List(ctx, &list, client.InNamespace(obj.GetNamespace()),
			client.MatchingFields{"involvedObject.name": obj.GetName()}); err != nil {
			return false, err
		}
		for _, ev := range list.Items {
			if ev.Reason != tc.Reason {
				continue
			}
			if !slices.ContainsFunc(r.expand(tc.Contains), func(w string) bool { return !strings.Contains(ev.Message, w) }) {
				found = true
				if len(ev.Message) > textlimit.MaxEventNote {
					r.t.Errorf("event note has %d bytes", len(ev.Message))
				}
			}
		}
		return found, nil
	})
	if err != nil {
		r.t.Fatalf("no %s event on %s %s containing %q within %s: %v\nevents:\n%s", tc.Reason, obj.GetKind(), obj.GetName(), tc.Contains, r.env.Timeout, err, r.events(ctx, obj))
	}
}

func (r *runner) expand(in []string) []string {
	out := make([]string, len(in))
	for i, s := range in {
		out[i] = r.vars.Replace(s)
	}
	return out
}

func (r *runner) events(ctx context.Context, obj *unstructured.Unstructured) string {
	var list corev1.EventList
	if err := r.c.List(ctx, &list, client.InNamespace(obj.GetNamespace()),
		client.MatchingFields{"involvedObject.name": obj.GetName()}); err != nil {
		return err.Error()
	}
	var b bytes.Buffer
	for _, ev := range list.Items {
		fmt.Fprintf(&b, "  %s %s: %s\n", ev.Type, ev.Reason, textlimit.Note(ev.Message, 300))
	}
	return b.String()
}

// cleanup deletes what the case created, newest first, and waits until it is gone,
// so the next case starts from the same configuration.
func (r *runner) cleanup(ctx context.Context) {
	for i := len(r.created) - 1; i >= 0; i-- {
		obj := r.created[i]
		if err := r.c.Delete(ctx, obj); err != nil && !apierrors.IsNotFound(err) {
			r.t.Errorf("deleting %s %s: %v", obj.GetKind(), obj.GetName(), err)
		}
	}
	for _, obj := range r.created {
		err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, r.env.Timeout, true, func(ctx context.Context) (bool, error) {
			err := r.c.Get(ctx, client.ObjectKeyFromObject(obj), obj.DeepCopy())
			return apierrors.IsNotFound(err), nil
		})
		if err != nil {
			r.t.Errorf("%s %s not gone: %v", obj.GetKind(), obj.GetName(), err)
		}
	}
}

// variables finds the values of the texts the cases may use.
func variables(ctx context.Context, c client.Client, env Env, cases []Case) (*strings.Replacer, error) {
	uses := func(v string) bool {
		return slices.ContainsFunc(cases, func(tc Case) bool {
			b, _ := yaml.Marshal(tc)
			return bytes.Contains(b, []byte(v))
		})
	}
	pairs := []string{"${INSTALL_NS}", env.InstallNS, "${SERVICE_NS}", env.ServiceNS, "${LONG}", longGarbage()}
	if uses("${SERVICE_CIDR}") {
		var l networkingv1.ServiceCIDRList
		if err := c.List(ctx, &l); err != nil {
			return nil, fmt.Errorf("listing ServiceCIDRs for ${SERVICE_CIDR}: %w", err)
		}
		if len(l.Items) == 0 || len(l.Items[0].Spec.CIDRs) == 0 {
			return nil, errors.New("the corpus uses ${SERVICE_CIDR} but the cluster has no ServiceCIDR")
		}
		pairs = append(pairs, "${SERVICE_CIDR}", l.Items[0].Spec.CIDRs[0])
	}
	if uses("${POD_CIDR}") {
		var l corev1.NodeList
		if err := c.List(ctx, &l); err != nil {
			return nil, fmt.Errorf("listing nodes for ${POD_CIDR}: %w", err)
		}
		i := slices.IndexFunc(l.Items, func(n corev1.Node) bool { return len(n.Spec.PodCIDRs) > 0 })
		if i < 0 {
			return nil, errors.New("the corpus uses ${POD_CIDR} but no node has spec.podCIDRs")
		}
		pairs = append(pairs, "${POD_CIDR}", l.Items[i].Spec.PodCIDRs[0])
	}
	return strings.NewReplacer(pairs...), nil
}

// longGarbage is 64 KiB that is no address, name or key: a comma list of
// not-quite addresses with quotes, percent signs and non-ASCII in it.
func longGarbage() string {
	var b strings.Builder
	for i := 0; b.Len() < 64<<10; i++ {
		fmt.Fprintf(&b, "10.%d.%d.%d%%x\\\"é,", i%256, i/256%256, i%7)
	}
	return b.String()
}

// warningLog collects the API server's warnings for the running case.
type warningLog struct {
	mu   sync.Mutex
	list []string
}

func (w *warningLog) HandleWarningHeader(_ int, _ string, text string) {
	w.mu.Lock()
	w.list = append(w.list, text)
	w.mu.Unlock()
}

func (w *warningLog) reset() {
	w.mu.Lock()
	w.list = nil
	w.mu.Unlock()
}

func (w *warningLog) get() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.list)
}
