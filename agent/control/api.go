package control

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/netip"

	"github.com/shoalnet/shoal/agent/doctor"
	"github.com/shoalnet/shoal/filter"
	"github.com/shoalnet/shoal/rules"
)

// Backend is what the API needs of the agent.
type Backend interface {
	Status() Status
	Query() Query
	Params() Params
	SetAdmin(ctx context.Context, req AdminRequest) error
	ListRules() []RuleInfo
	AddRule(ctx context.Context, req RuleRequest) (RuleInfo, error)
	RemoveRule(ctx context.Context, target string) error
	EditRule(ctx context.Context, target string, req RuleEditRequest) (RuleInfo, error)
	SetSettings(ctx context.Context, req SettingsRequest) error
	SetRuleState(ctx context.Context, req RuleStateRequest) error
	SetWeight(ctx context.Context, req WeightRequest) error
	SetPriority(ctx context.Context, req PriorityRequest) error
	Leave(ctx context.Context) error
	Plug(ctx context.Context, req PlugRequest) error
	Restart(ctx context.Context, req RestartRequest) (RestartArmed, error)
	Simulate(client, to netip.AddrPort, proto string) (Simulation, error)
	Flow(ctx context.Context, client, to netip.AddrPort, proto filter.Protocol, peers bool) (Flow, error)
	Doctor(ctx context.Context, cluster bool) []doctor.Report
}

// maxRequestBody bounds what a client may send.
const maxRequestBody = 1 << 20

// Handler serves the local control API.
func Handler(c Backend) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/status", func(w http.ResponseWriter, r *http.Request) { WriteJSON(w, http.StatusOK, c.Status()) })
	mux.HandleFunc("GET /v1/query", func(w http.ResponseWriter, r *http.Request) { WriteJSON(w, http.StatusOK, c.Query()) })
	mux.HandleFunc("GET /v1/params", func(w http.ResponseWriter, r *http.Request) { WriteJSON(w, http.StatusOK, c.Params()) })
	mux.HandleFunc("GET /v1/rules", func(w http.ResponseWriter, r *http.Request) { WriteJSON(w, http.StatusOK, c.ListRules()) })
	mux.HandleFunc("GET /v1/simulate", func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		client, err1 := netip.ParseAddrPort(q.Get("client"))
		to, err2 := netip.ParseAddrPort(q.Get("to"))
		if err := errors.Join(err1, err2); err != nil {
			WriteError(w, BadRequest("want client=IP:PORT and to=VIP:PORT: %v", err))
			return
		}
		sim, err := c.Simulate(client, to, q.Get("proto"))
		if err != nil {
			WriteError(w, err)
			return
		}
		WriteJSON(w, http.StatusOK, sim)
	})
	mux.HandleFunc("GET /v1/flow", func(w http.ResponseWriter, r *http.Request) {
		client, to, proto, err := ParseFlowQuery(r.URL.Query())
		if err != nil {
			WriteError(w, err)
			return
		}
		f, err := c.Flow(r.Context(), client, to, proto, r.URL.Query().Get("peers") != "0")
		if err != nil {
			WriteError(w, err)
			return
		}
		WriteJSON(w, http.StatusOK, f)
	})
	mux.HandleFunc("GET /v1/doctor", func(w http.ResponseWriter, r *http.Request) {
		WriteJSON(w, http.StatusOK, c.Doctor(r.Context(), r.URL.Query().Get("cluster") == "true"))
	})
	mux.HandleFunc("POST /v1/admin", Handle(c.SetAdmin))
	mux.HandleFunc("POST /v1/rules", func(w http.ResponseWriter, r *http.Request) {
		var req RuleRequest
		if !decode(w, r, &req) {
			return
		}
		info, err := c.AddRule(r.Context(), req)
		if err != nil {
			WriteError(w, err)
			return
		}
		WriteJSON(w, http.StatusCreated, info)
	})
	mux.HandleFunc("DELETE /v1/rules/{target}", func(w http.ResponseWriter, r *http.Request) {
		if err := c.RemoveRule(r.Context(), r.PathValue("target")); err != nil {
			WriteError(w, err)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	})
	mux.HandleFunc("PUT /v1/rules/{target}", func(w http.ResponseWriter, r *http.Request) {
		var req RuleEditRequest
		if !decode(w, r, &req) {
			return
		}
		info, err := c.EditRule(r.Context(), r.PathValue("target"), req)
		if err != nil {
			WriteError(w, err)
			return
		}
		WriteJSON(w, http.StatusOK, info)
	})
	mux.HandleFunc("POST /v1/rules/state", Handle(c.SetRuleState))
	mux.HandleFunc("POST /v1/settings", Handle(c.SetSettings))
	mux.HandleFunc("POST /v1/weight", Handle(c.SetWeight))
	mux.HandleFunc("POST /v1/priority", Handle(c.SetPriority))
	mux.HandleFunc("POST /v1/plug", Handle(c.Plug))
	mux.HandleFunc("POST /v1/restart", func(w http.ResponseWriter, r *http.Request) {
		var req RestartRequest
		if !decode(w, r, &req) {
			return
		}
		armed, err := c.Restart(r.Context(), req)
		if err != nil {
			WriteError(w, err)
			return
		}
		WriteJSON(w, http.StatusOK, armed)
	})
	mux.HandleFunc("POST /v1/leave", func(w http.ResponseWriter, r *http.Request) {
		if err := c.Leave(r.Context()); err != nil {
			WriteError(w, err)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	})
	return Recoverer(mux)
}

// handle adapts a request-taking method to a handler answering 204.
func Handle[T any](f func(context.Context, T) error) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		var req T
		if !decode(w, r, &req) {
			return
		}
		if err := f(r.Context(), req); err != nil {
			WriteError(w, err)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	}
}

func decode(w http.ResponseWriter, r *http.Request, v any) bool {
	dec := json.NewDecoder(io.LimitReader(r.Body, maxRequestBody))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		WriteJSON(w, http.StatusBadRequest, APIError{Error: fmt.Sprintf("bad request body: %v", err)})
		return false
	}
	return true
}

func WriteJSON(w http.ResponseWriter, code int, v any) {
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

// ErrBadRequest marks errors in what the caller sent.
var ErrBadRequest = errors.New("bad request")

func WriteError(w http.ResponseWriter, err error) {
	code := http.StatusInternalServerError
	switch {
	case errors.Is(err, ErrBadRequest), errors.Is(err, rules.ErrInvalid), errors.Is(err, rules.ErrConflict),
		errors.Is(err, rules.ErrUnknownVIP):
		code = http.StatusBadRequest
	case errors.Is(err, rules.ErrUnknownNode), errors.Is(err, rules.ErrUnknownRule):
		code = http.StatusNotFound
	case errors.Is(err, rules.ErrNoQuorum), errors.Is(err, context.DeadlineExceeded):
		code = http.StatusServiceUnavailable
	}
	WriteJSON(w, code, APIError{Error: err.Error()})
}

// Recoverer turns a panic in a handler into a 500, so no request can take
// the agent down.
func Recoverer(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer func() {
			if p := recover(); p != nil {
				slog.Error("control api panic", "path", r.URL.Path, "panic", p)
				WriteJSON(w, http.StatusInternalServerError, APIError{Error: fmt.Sprintf("internal error: %v", p)})
			}
		}()
		h.ServeHTTP(w, r)
	})
}
