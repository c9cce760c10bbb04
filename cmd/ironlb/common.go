package main

import (
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"

	"github.com/go-logr/logr"
	"go.uber.org/zap/zapcore"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
)

// Helpers shared by the subcommands: one --log-level and one --kubeconfig meaning
// for the controller, the speaker and cleanup.

// newLogger builds a JSON zap logger at MetalLB's --log-level values.
func newLogger(level string) (logr.Logger, error) {
	var lvl zapcore.LevelEnabler
	switch strings.ToLower(level) {
	case "all":
		lvl = zapcore.Level(-10) // every V-level of logr
	case "debug":
		lvl = zapcore.DebugLevel
	case "info", "":
		lvl = zapcore.InfoLevel
	case "warn":
		lvl = zapcore.WarnLevel
	case "error":
		lvl = zapcore.ErrorLevel
	case "none":
		return logr.Discard(), nil
	default:
		return logr.Logger{}, fmt.Errorf("--log-level %q: must be all, debug, info, warn, error or none", level)
	}
	return zap.New(zap.Level(lvl), zap.JSONEncoder()), nil
}

func hostPort(host string, port int) string {
	if port == 0 {
		return "0"
	}
	return net.JoinHostPort(host, strconv.Itoa(port))
}

func firstNonEmpty(vals ...string) string {
	for _, v := range vals {
		if v = strings.TrimSpace(v); v != "" {
			return v
		}
	}
	return ""
}

func readFile(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	return string(b)
}

// restConfig loads an explicit --kubeconfig; nil (no file given) lets
// controller-runtime's GetConfig pick $KUBECONFIG, the in-cluster service
// account or ~/.kube/config.
func restConfig(kubeconfig string) (*rest.Config, error) {
	if kubeconfig == "" {
		return nil, nil
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("loading kubeconfig %q: %w", kubeconfig, err)
	}
	return cfg, nil
}
