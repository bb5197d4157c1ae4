package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/netip"

	"github.com/shoalnet/shoal/filter"
	"github.com/shoalnet/shoal/rules"
)

// control is what the API needs of the agent.
type control interface {
	status() Status
	query() Query
	params() Params
	setAdmin(ctx context.Context, req AdminRequest) error
	listRules() []RuleInfo
	addRule(ctx context.Context, req RuleRequest) (RuleInfo, error)
	removeRule(ctx context.Context, target string) error
	editRule(ctx context.Context, target string, req RuleEditRequest) (RuleInfo, error)
	setSettings(ctx context.Context, req SettingsRequest) error
	setRuleState(ctx context.Context, req RuleStateRequest) error
	setWeight(ctx context.Context, req WeightRequest) error
	setPriority(ctx context.Context, req PriorityRequest) error
	leave(ctx context.Context) error
	plug(ctx context.Context, req PlugRequest) error
	restart(ctx context.Context, req RestartRequest) (RestartArmed, error)
	simulate(client, to netip.AddrPort, proto string) (Simulation, error)
	flow(ctx context.Context, client, to netip.AddrPort, proto filter.Protocol, peers bool) (Flow, error)
	doctor(ctx context.Context, cluster bool) []DoctorReport
}

// maxRequestBody bounds what a client may send.
const maxRequestBody = 1 << 20

// controlHandler serves the local control API.
func controlHandler(c control) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/status", func(w http.ResponseWriter, r *http.Request) { writeJSON(w, http.StatusOK, c.status()) })
	mux.HandleFunc("GET /v1/query", func(w http.ResponseWriter, r *http.Request) { writeJSON(w, http.StatusOK, c.query()) })
	mux.HandleFunc("GET /v1/params", func(w http.ResponseWriter, r *http.Request) { writeJSON(w, http.StatusOK, c.params()) })
	mux.HandleFunc("GET /v1/rules", func(w http.ResponseWriter, r *http.Request) { writeJSON(w, http.StatusOK, c.listRules()) })
	mux.HandleFunc("GET /v1/simulate", func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		client, err1 := netip.ParseAddrPort(q.Get("client"))
		to, err2 := netip.ParseAddrPort(q.Get("to"))
		if err := errors.Join(err1, err2); err != nil {
			writeError(w, badRequest("want client=IP:PORT and to=VIP:PORT: %v", err))
			return
		}
		sim, err := c.simulate(client, to, q.Get("proto"))
		if err != nil {
			writeError(w, err)
			return
		}
		writeJSON(w, http.StatusOK, sim)
	})
	mux.HandleFunc("GET /v1/flow", func(w http.ResponseWriter, r *http.Request) {
		client, to, proto, err := parseFlowQuery(r.URL.Query())
		if err != nil {
			writeError(w, err)
			return
		}
		f, err := c.flow(r.Context(), client, to, proto, r.URL.Query().Get("peers") != "0")
		if err != nil {
			writeError(w, err)
			return
		}
		writeJSON(w, http.StatusOK, f)
	})
	mux.HandleFunc("GET /v1/doctor", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, c.doctor(r.Context(), r.URL.Query().Get("cluster") == "true"))
	})
	mux.HandleFunc("POST /v1/admin", handle(c.setAdmin))
	mux.HandleFunc("POST /v1/rules", func(w http.ResponseWriter, r *http.Request) {
		var req RuleRequest
		if !decode(w, r, &req) {
			return
		}
		info, err := c.addRule(r.Context(), req)
		if err != nil {
			writeError(w, err)
			return
		}
		writeJSON(w, http.StatusCreated, info)
	})
	mux.HandleFunc("DELETE /v1/rules/{target}", func(w http.ResponseWriter, r *http.Request) {
		if err := c.removeRule(r.Context(), r.PathValue("target")); err != nil {
			writeError(w, err)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	})
	mux.HandleFunc("PUT /v1/rules/{target}", func(w http.ResponseWriter, r *http.Request) {
		var req RuleEditRequest
		if !decode(w, r, &req) {
			return
		}
		info, err := c.editRule(r.Context(), r.PathValue("target"), req)
		if err != nil {
			writeError(w, err)
			return
		}
		writeJSON(w, http.StatusOK, info)
	})
	mux.HandleFunc("POST /v1/rules/state", handle(c.setRuleState))
	mux.HandleFunc("POST /v1/settings", handle(c.setSettings))
	mux.HandleFunc("POST /v1/weight", handle(c.setWeight))
	mux.HandleFunc("POST /v1/priority", handle(c.setPriority))
	mux.HandleFunc("POST /v1/plug", handle(c.plug))
	mux.HandleFunc("POST /v1/restart", func(w http.ResponseWriter, r *http.Request) {
		var req RestartRequest
		if !decode(w, r, &req) {
			return
		}
		armed, err := c.restart(r.Context(), req)
		if err != nil {
			writeError(w, err)
			return
		}
		writeJSON(w, http.StatusOK, armed)
	})
	mux.HandleFunc("POST /v1/leave", func(w http.ResponseWriter, r *http.Request) {
		if err := c.leave(r.Context()); err != nil {
			writeError(w, err)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	})
	return recoverer(mux)
}

// handle adapts a request-taking method to a handler answering 204.
func handle[T any](f func(context.Context, T) error) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		var req T
		if !decode(w, r, &req) {
			return
		}
		if err := f(r.Context(), req); err != nil {
			writeError(w, err)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	}
}

func decode(w http.ResponseWriter, r *http.Request, v any) bool {
	dec := json.NewDecoder(io.LimitReader(r.Body, maxRequestBody))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		writeJSON(w, http.StatusBadRequest, APIError{Error: fmt.Sprintf("bad request body: %v", err)})
		return false
	}
	return true
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	// Encode first: a value that cannot be encoded is a 500 that says why,
	// not a 200 with an empty body.
	b, err := json.Marshal(v)
	if err != nil {
		http.Error(w, fmt.Sprintf("encode reply: %v", err), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	w.Write(append(b, '\n'))
}

// errBadRequest marks errors in what the caller sent.
var errBadRequest = errors.New("bad request")

func writeError(w http.ResponseWriter, err error) {
	code := http.StatusInternalServerError
	switch {
	case errors.Is(err, errBadRequest), errors.Is(err, rules.ErrInvalid), errors.Is(err, rules.ErrConflict),
		errors.Is(err, rules.ErrUnknownVIP):
		code = http.StatusBadRequest
	case errors.Is(err, rules.ErrUnknownNode), errors.Is(err, rules.ErrUnknownRule):
		code = http.StatusNotFound
	case errors.Is(err, rules.ErrNoQuorum), errors.Is(err, context.DeadlineExceeded):
		code = http.StatusServiceUnavailable
	}
	writeJSON(w, code, APIError{Error: err.Error()})
}

// recoverer turns a panic in a handler into a 500, so no request can take
// the agent down.
func recoverer(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer func() {
			if p := recover(); p != nil {
				slog.Error("control api panic", "path", r.URL.Path, "panic", p)
				writeJSON(w, http.StatusInternalServerError, APIError{Error: fmt.Sprintf("internal error: %v", p)})
			}
		}()
		h.ServeHTTP(w, r)
	})
}
