package server

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"time"
)

// adminServer serves /healthz and /metrics over HTTP.
type adminServer struct {
	addr string
	http *http.Server
	done chan struct{}
}

func startAdmin(addr string, s *Server) (*adminServer, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("server: admin listen on %s: %w", addr, err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		if s.draining.Load() {
			http.Error(w, "draining\n", http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("GET /metrics", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
		s.writePrometheus(w)
	})
	a := &adminServer{
		addr: ln.Addr().String(),
		http: &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second},
		done: make(chan struct{}),
	}
	go func() {
		defer close(a.done)
		_ = a.http.Serve(ln)
	}()
	return a, nil
}

func (a *adminServer) close() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_ = a.http.Shutdown(ctx)
	<-a.done
}
