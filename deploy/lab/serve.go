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

// Serve runs the lab's node HTTP server on every address of listen until
// ctx ends. The sockets are bound with IP_FREEBIND, so it may start before
// the agent puts the VIPs on lo.
func Serve(ctx context.Context, name string, listen []string, log *slog.Logger) error {
	if len(listen) == 0 {
		return errors.New("lab serve: no address to listen on")
	}
	lc := net.ListenConfig{Control: freebind}
	var lns []net.Listener
	for _, a := range listen {
		ln, err := lc.Listen(ctx, "tcp", a)
		if err != nil {
			for _, l := range lns {
				l.Close()
			}
			return fmt.Errorf("lab serve: %w", err)
		}
		lns = append(lns, ln)
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
	errs := make(chan error, len(lns))
	for _, ln := range lns {
		log.Info("serving", "name", name, "addr", ln.Addr().String())
		go func() { errs <- srv.Serve(ln) }()
	}
	var first error
	for range lns {
		if err := <-errs; !errors.Is(err, http.ErrServerClosed) && first == nil {
			first = err
			srv.Close() // one listener failed: stop them all
		}
	}
	if first != nil {
		return fmt.Errorf("lab serve: %w", first)
	}
	<-stopped
	return nil
}
