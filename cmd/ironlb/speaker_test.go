package main

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ironlb/ironlb/internal/layer2"
)

// The flags take MetalLB's environment variables as defaults, and explicit
// flags win over them.
func TestSpeakerFlagsFromEnvironment(t *testing.T) {
	t.Setenv("METALLB_NODE_NAME", "myk8s-worker")
	t.Setenv("METALLB_HOST", "172.18.0.3")
	t.Setenv("METALLB_NAMESPACE", "metallb-system")
	t.Setenv("METALLB_POD_NAME", "speaker-abcde")
	t.Setenv("METALLB_ML_BIND_ADDR", "172.18.0.3")
	t.Setenv("METALLB_ML_BIND_PORT", "7947")
	t.Setenv("METALLB_ML_LABELS", "app=speaker")
	t.Setenv("METALLB_ML_SECRET_KEY_PATH", "/etc/ml_secret_key")

	cmd := newSpeakerCommand()
	if err := cmd.ParseFlags([]string{"--ml-bindport=7950", "--ml-probe-interval=300ms"}); err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		"node-name":          "myk8s-worker",
		"host":               "172.18.0.3",
		"namespace":          "metallb-system",
		"pod-name":           "speaker-abcde",
		"ml-bindaddr":        "172.18.0.3",
		"ml-bindport":        "7950", // the flag wins over the environment
		"ml-labels":          "app=speaker",
		"ml-secret-key-path": "/etc/ml_secret_key",
		"ml-probe-interval":  (300 * time.Millisecond).String(),
		"garp-interval":      (1100 * time.Millisecond).String(),
		"health-probe-host":  "127.0.0.1", // not every address of the node
		"enable-http2":       "false",
	}
	for name, v := range want {
		f := cmd.Flags().Lookup(name)
		if f == nil {
			t.Errorf("flag --%s missing", name)
			continue
		}
		if f.Value.String() != v {
			t.Errorf("--%s = %q, want %q", name, f.Value.String(), v)
		}
	}
}

// Every flag explains itself in --help.
func TestSpeakerFlagsHaveHelp(t *testing.T) {
	cmd := newSpeakerCommand()
	usage := cmd.Flags().FlagUsages()
	for _, line := range strings.Split(strings.TrimSpace(usage), "\n") {
		fields := strings.Fields(line)
		if len(fields) < 3 {
			t.Errorf("flag without help text: %q", line)
		}
	}
}

func TestLogLevel(t *testing.T) {
	for _, ok := range []string{"all", "debug", "info", "warn", "error", "none", "INFO"} {
		if _, err := newLogger(ok); err != nil {
			t.Errorf("%q: %v", ok, err)
		}
	}
	if _, err := newLogger("loud"); err == nil {
		t.Error("unknown level accepted")
	}
}

// --exclude-interfaces takes one regular expression per flag, commas
// included; the flag replaces the defaults, and an empty value alone means
// no exclusion.
func TestSpeakerExcludeInterfaces(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want []string
	}{
		{nil, layer2.DefaultExcludeInterfaces},
		{[]string{"--exclude-interfaces=^eth{1,3}$"}, []string{"^eth{1,3}$"}},
		{[]string{"--exclude-interfaces=^a.*", "--exclude-interfaces=^b{2,}$"}, []string{"^a.*", "^b{2,}$"}},
		{[]string{"--exclude-interfaces="}, []string{}},
	} {
		cmd := newSpeakerCommand()
		if err := cmd.ParseFlags(tc.args); err != nil {
			t.Fatalf("%v: %v", tc.args, err)
		}
		got, err := cmd.Flags().GetStringArray("exclude-interfaces")
		if err != nil {
			t.Fatal(err)
		}
		if got = nonEmpty(got); !slices.Equal(got, tc.want) {
			t.Errorf("%v: patterns %q, want %q", tc.args, got, tc.want)
		}
		if _, err := layer2.CompileExcludes(got); err != nil {
			t.Errorf("%v: %v", tc.args, err)
		}
	}
}
