package lab

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"
)

// NodeHeader names the node that answered a request.
const NodeHeader = "X-Shoal-Node"

// Handler answers every request with the node's name, in the body and in
// the X-Shoal-Node header.
func Handler(name string) http.Handler {
	body := []byte(name + "\n")
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set(NodeHeader, name)
		w.Header().Set("Content-Type", "text/plain")
		w.Write(body)
	})
}

// Serve runs the lab's node HTTP server on listen until ctx ends. The socket
// is bound with IP_FREEBIND, so it may start before the agent puts the VIP on
// lo.
func Serve(ctx context.Context, name, listen string, log *slog.Logger) error {
	lc := net.ListenConfig{Control: freebind}
	ln, err := lc.Listen(ctx, "tcp", listen)
	if err != nil {
		return fmt.Errorf("lab serve: %w", err)
	}
	srv := &http.Server{Handler: Handler(name), ReadHeaderTimeout: 10 * time.Second}
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		srv.Shutdown(sctx)
	}()
	log.Info("serving", "name", name, "addr", ln.Addr().String())
	err = srv.Serve(ln)
	if errors.Is(err, http.ErrServerClosed) {
		<-stopped
		return nil
	}
	return fmt.Errorf("lab serve: %w", err)
}
