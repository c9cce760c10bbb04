package agent

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"strconv"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/remotecommand"
	"k8s.io/streaming/pkg/httpstream"
	"k8s.io/streaming/pkg/httpstream/spdy"
)

// handleExec serves the kubelet's /exec/{namespace}/{pod}/{container}
// endpoint for `kubectl exec`: the SPDY remote-command protocol v4 (the API
// server translates kubectl's websocket to it). The command joins the
// running container's namespaces through nsenter. There is no TTY support: a
// requested TTY gets plain pipes (stderr merged into stdout).
func (a *Agent) handleExec(w http.ResponseWriter, r *http.Request) {
	ns, podName, container := r.PathValue("namespace"), r.PathValue("pod"), r.PathValue("container")
	q := r.URL.Query()
	command := q["command"]
	flag := func(names ...string) bool {
		for _, n := range names {
			if v := q.Get(n); v == "1" || v == "true" {
				return true
			}
		}
		return false
	}
	wantStdin, wantStdout, wantStderr, tty := flag("input", "stdin"), flag("output", "stdout"), flag("error", "stderr"), flag("tty")
	if len(command) == 0 {
		http.Error(w, "exec: no command", http.StatusBadRequest)
		return
	}
	wk := a.workerByName(ns, podName)
	var cr *containerRunner
	if wk != nil {
		cr = wk.runner(container)
	}
	if cr == nil {
		http.Error(w, fmt.Sprintf("container %q in pod %s/%s not found on node %s", container, ns, podName, a.cfg.NodeName), http.StatusNotFound)
		return
	}
	cmd, err := cr.execCommand(command)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}

	if _, err := httpstream.Handshake(r, w, []string{remotecommand.StreamProtocolV4Name}); err != nil {
		return // Handshake wrote the error response
	}
	type received struct {
		s     httpstream.Stream
		reply <-chan struct{}
	}
	streamCh := make(chan received, 8)
	conn := spdy.NewResponseUpgrader().UpgradeResponse(w, r, func(s httpstream.Stream, reply <-chan struct{}) error {
		streamCh <- received{s, reply}
		return nil
	})
	if conn == nil {
		return // UpgradeResponse wrote the error response
	}
	// Errors closing the connection or its streams mean the client is gone: nothing to tell it.
	defer func() { _ = conn.Close() }()
	conn.SetIdleTimeout(4 * time.Hour)

	expected := 1
	for _, b := range []bool{wantStdin, wantStdout, wantStderr && !tty, tty} {
		if b {
			expected++
		}
	}
	streams := map[string]httpstream.Stream{}
	timeout := time.After(30 * time.Second)
	for len(streams) < expected {
		select {
		case rc := <-streamCh:
			<-rc.reply
			streams[rc.s.Headers().Get(corev1.StreamType)] = rc.s
		case <-timeout:
			a.log.Info("exec: timed out waiting for the client's streams", "pod", ns+"/"+podName, "received", len(streams), "expected", expected)
			return
		case <-r.Context().Done():
			return
		}
	}
	errStream := streams[corev1.StreamTypeError]
	if errStream == nil {
		return
	}
	defer func() { _ = errStream.Close() }()

	if s := streams[corev1.StreamTypeStdout]; s != nil {
		cmd.Stdout = s
		if tty {
			cmd.Stderr = s
		}
		defer func() { _ = s.Close() }()
	}
	if s := streams[corev1.StreamTypeStderr]; s != nil {
		cmd.Stderr = s
		defer func() { _ = s.Close() }()
	}
	var stdinPipe io.WriteCloser
	if s := streams[corev1.StreamTypeStdin]; s != nil {
		if stdinPipe, err = cmd.StdinPipe(); err != nil {
			writeExecStatus(errStream, err)
			return
		}
	}
	if err := cmd.Start(); err != nil {
		writeExecStatus(errStream, err)
		return
	}
	if stdinPipe != nil {
		// Not waited for: the client may never close stdin.
		go func() {
			// Ends when the client closes stdin or the process exits; either way
			// the process sees EOF.
			_, _ = io.Copy(stdinPipe, streams[corev1.StreamTypeStdin])
			_ = stdinPipe.Close()
		}()
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err = <-done:
	case <-conn.CloseChan():
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) // fails only if it has exited; Wait returns either way
		err = <-done
	}
	writeExecStatus(errStream, err)
}

// writeExecStatus reports how the command ended on the error stream, as a
// metav1.Status (protocol v4).
func writeExecStatus(w io.Writer, err error) {
	st := metav1.Status{Status: metav1.StatusSuccess}
	var ee *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &ee):
		st = metav1.Status{
			Status:  metav1.StatusFailure,
			Reason:  remotecommand.NonZeroExitCodeReason,
			Message: fmt.Sprintf("command terminated with non-zero exit code: %v", err),
			Details: &metav1.StatusDetails{Causes: []metav1.StatusCause{{
				Type: remotecommand.ExitCodeCauseType, Message: strconv.Itoa(ee.ExitCode() & 0xff),
			}}},
		}
	default:
		st = metav1.Status{Status: metav1.StatusFailure, Message: err.Error()}
	}
	b, _ := json.Marshal(st)
	_, _ = w.Write(b) // fails only when the client has gone
}
