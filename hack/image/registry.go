package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"time"

	"github.com/google/go-containerregistry/pkg/registry"
)

// ServeRegistry runs an in-memory OCI registry (go-containerregistry's) on a loopback
// address until ctx ends, for the release dry run: the image and the chart are pushed to
// it exactly as to ghcr.io. It refuses other addresses: nothing leaves the machine.
// ready receives the address it listens on.
func ServeRegistry(ctx context.Context, listen string, ready func(addr string) error) error {
	host, _, err := net.SplitHostPort(listen)
	if err != nil {
		return fmt.Errorf("registry --listen %q: %w", listen, err)
	}
	if ip := net.ParseIP(host); ip == nil || !ip.IsLoopback() {
		return fmt.Errorf("registry --listen %q: want a loopback address such as 127.0.0.1:0", listen)
	}
	lis, err := net.Listen("tcp", listen)
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: registry.New(registry.Logger(log.New(io.Discard, "", 0))), ReadHeaderTimeout: 10 * time.Second}
	if err := ready(lis.Addr().String()); err != nil {
		_ = lis.Close() // the ready error is the one to report
		return err
	}
	go func() {
		<-ctx.Done()
		_ = srv.Close() // ends Serve below
	}()
	if err := srv.Serve(lis); !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

func runRegistry(ctx context.Context, args []string) error {
	fs := newFlagSet("registry")
	listen := fs.String("listen", "127.0.0.1:0", "loopback address to listen on")
	addrFile := fs.String("addr-file", "", "write the address listened on to this file")
	if err := fs.Parse(args); err != nil {
		return err
	}
	return ServeRegistry(ctx, *listen, func(addr string) error {
		fmt.Println(addr)
		if *addrFile == "" {
			return nil
		}
		return os.WriteFile(*addrFile, []byte(addr+"\n"), 0o644)
	})
}
