package labnet

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"golang.org/x/sys/unix"
)

// DialInNS opens a TCP connection to addr from inside the named network namespace. Only the
// socket is created in the namespace (on a thread switched there for that one call); the
// connection is then used from any goroutine, so the caller's namespace needs no route.
func DialInNS(ctx context.Context, ns string, addr netip.AddrPort) (net.Conn, error) {
	var family int
	var sa unix.Sockaddr
	if a := addr.Addr().Unmap(); a.Is4() {
		family, sa = unix.AF_INET, &unix.SockaddrInet4{Addr: a.As4(), Port: int(addr.Port())}
	} else {
		family, sa = unix.AF_INET6, &unix.SockaddrInet6{Addr: a.As16(), Port: int(addr.Port())}
	}
	var fd int
	if err := InNS(ns, func() error {
		var err error
		fd, err = unix.Socket(family, unix.SOCK_STREAM|unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK, 0)
		if err != nil {
			return fmt.Errorf("creating a socket: %w", err)
		}
		return nil
	}); err != nil {
		return nil, err
	}
	f := os.NewFile(uintptr(fd), "lab-socket")
	// Closes the socket on failure; on success net.FileConn has made its own duplicate.
	defer func() { _ = f.Close() }()
	err := unix.Connect(fd, sa)
	if err != nil && !errors.Is(err, unix.EINPROGRESS) {
		return nil, fmt.Errorf("connecting to %s in %s: %w", addr, ns, err)
	}
	// Wait for the non-blocking connect to finish, bounded by ctx.
	deadline := time.Now().Add(10 * time.Second)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	for {
		timeout := time.Until(deadline)
		if timeout <= 0 {
			return nil, fmt.Errorf("connecting to %s in %s: timed out", addr, ns)
		}
		if ctx.Err() != nil {
			return nil, fmt.Errorf("connecting to %s in %s: %w", addr, ns, ctx.Err())
		}
		wait := min(timeout, 100*time.Millisecond)
		fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLOUT}}
		n, err := unix.Poll(fds, int(wait.Milliseconds())+1)
		if err != nil && !errors.Is(err, unix.EINTR) {
			return nil, fmt.Errorf("connecting to %s in %s: poll: %w", addr, ns, err)
		}
		if n > 0 {
			soErr, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_ERROR)
			if err != nil {
				return nil, fmt.Errorf("connecting to %s in %s: %w", addr, ns, err)
			}
			if soErr != 0 {
				return nil, fmt.Errorf("connecting to %s in %s: %w", addr, ns, unix.Errno(soErr))
			}
			break
		}
	}
	// FileConn dups the descriptor; f's copy is closed by the defer.
	return net.FileConn(f)
}

// Forwarder accepts TCP connections on a listener in the current namespace and relays each to
// a target address dialled from inside a lab namespace.
type Forwarder struct {
	NS     string
	Target netip.AddrPort
	Log    logr.Logger
}

// Serve accepts on l until ctx is done, then closes l and waits for open relays to end.
func (f *Forwarder) Serve(ctx context.Context, l net.Listener) error {
	var wg sync.WaitGroup
	ctx, cancel := context.WithCancel(ctx)
	defer func() {
		cancel()
		wg.Wait()
	}()
	go func() {
		<-ctx.Done()
		_ = l.Close() // ends Accept below; ctx.Err() tells it why
	}()
	for {
		c, err := l.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			return fmt.Errorf("accepting on %s: %w", l.Addr(), err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			f.relay(ctx, c)
		}()
	}
}

func (f *Forwarder) relay(ctx context.Context, c net.Conn) {
	// Errors closing the relayed connections mean one side has gone: nothing to tell anyone.
	defer func() { _ = c.Close() }()
	dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	up, err := DialInNS(dctx, f.NS, f.Target)
	cancel()
	if err != nil {
		f.Log.Error(err, "Relaying a connection failed", "client", c.RemoteAddr().String(), "netns", f.NS, "target", f.Target.String())
		return
	}
	defer func() { _ = up.Close() }()
	// Close both ends when ctx ends so the copies below return.
	stop := context.AfterFunc(ctx, func() {
		_ = c.Close()
		_ = up.Close()
	})
	defer stop()
	done := make(chan struct{}, 2)
	pipe := func(dst, src net.Conn) {
		_, _ = io.Copy(dst, src)
		if tc, ok := dst.(*net.TCPConn); ok {
			_ = tc.CloseWrite()
		}
		done <- struct{}{}
	}
	go pipe(up, c)
	go pipe(c, up)
	<-done
	<-done
}
