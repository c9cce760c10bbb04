//go:build e2e

package e2e

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os/exec"

	"github.com/ironlb/ironlb/test/lab/labctl"
)

// ClientHost is the external client's host name (the walkthrough's mypc).
const ClientHost = "mypc"

// Result is a command's output and exit code.
type Result struct {
	Stdout, Stderr string
	Code           int
}

// Hosts runs commands on the machines of the cluster under test: the external
// client (ClientHost) and the nodes (by node name).
type Hosts interface {
	// Run runs argv on host. The error is only for failing to run it at all;
	// a non-zero exit is in Result.Code.
	Run(ctx context.Context, host string, argv ...string) (Result, error)
}

// NodeKiller is implemented by Hosts that can crash a node hard and bring it
// back (the lab). Tests that need it skip without it.
type NodeKiller interface {
	KillNode(ctx context.Context, node string) error
	RestoreNode(ctx context.Context, node string) error
}

// PodLogger is implemented by Hosts that read container logs themselves (the
// lab's node agent has no log endpoint for kubectl logs).
type PodLogger interface {
	PodLogs(namespace, name string) (string, error)
}

// LabHosts runs commands in the lab's network namespaces (labctl.Lab.Exec).
type LabHosts struct{ Lab *labctl.Lab }

func (h LabHosts) Run(ctx context.Context, host string, argv ...string) (Result, error) {
	var out, errb bytes.Buffer
	code, err := h.Lab.Exec(ctx, host, argv, nil, &out, &errb)
	return Result{Stdout: out.String(), Stderr: errb.String(), Code: code}, err
}

func (h LabHosts) KillNode(ctx context.Context, node string) error { return h.Lab.KillNode(ctx, node) }

func (h LabHosts) RestoreNode(ctx context.Context, node string) error {
	return h.Lab.RestoreNode(ctx, node)
}

func (h LabHosts) PodLogs(namespace, name string) (string, error) {
	var b bytes.Buffer
	err := h.Lab.Logs(namespace+"/"+name, "", &b)
	return b.String(), err
}

// DockerHosts runs commands with docker exec: kind's nodes are containers named
// after the nodes; Client is the client container (attached to kind's network).
type DockerHosts struct{ Client string }

func (h DockerHosts) Run(ctx context.Context, host string, argv ...string) (Result, error) {
	if host == ClientHost && h.Client != "" {
		host = h.Client
	}
	var out, errb bytes.Buffer
	cmd := exec.CommandContext(ctx, "docker", append([]string{"exec", host}, argv...)...)
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return Result{Stdout: out.String(), Stderr: errb.String(), Code: ee.ExitCode()}, nil
	}
	if err != nil {
		return Result{}, fmt.Errorf("docker exec %s %v: %w", host, argv, err)
	}
	return Result{Stdout: out.String(), Stderr: errb.String()}, nil
}
