// Command lab-whoami is the lab's stand-in for traefik/whoami; see package
// test/lab/whoami.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"github.com/ironlb/ironlb/test/lab/whoami"
)

func main() {
	port := flag.Int("port", 80, "TCP port to listen on")
	flag.Parse()
	if p := os.Getenv("WHOAMI_PORT_NUMBER"); p != "" {
		if n, err := strconv.Atoi(p); err == nil {
			*port = n
		}
	}
	srv := &http.Server{
		Addr:              net.JoinHostPort("", strconv.Itoa(*port)),
		Handler:           whoami.Handler(whoami.Hostname()),
		ReadHeaderTimeout: 10 * time.Second,
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := srv.Shutdown(sctx); err != nil {
			fmt.Fprintln(os.Stderr, "lab-whoami: shutdown:", err)
		}
	}()
	fmt.Fprintf(os.Stderr, "lab-whoami: listening on %s as %s\n", srv.Addr, whoami.Hostname())
	if err := srv.ListenAndServe(); err != nil && !errors.Is(err, http.ErrServerClosed) {
		fmt.Fprintln(os.Stderr, "lab-whoami:", err)
		os.Exit(1)
	}
}
