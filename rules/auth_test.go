package rules

import (
	"bytes"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

func TestAuthenticate(t *testing.T) {
	now := time.Date(2026, 11, 30, 4, 0, 0, 0, time.UTC)
	var gotBody string
	h := authenticate(testKey, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		gotBody = string(b)
		w.WriteHeader(http.StatusNoContent)
	}), func() time.Time { return now }, slog.New(slog.DiscardHandler))
	otherKey := bytes.Repeat([]byte{7}, KeySize)

	tests := []struct {
		name   string
		key    []byte
		signAt time.Time
		tamper func(r *http.Request)
		want   int
	}{
		{"signed", testKey, now, nil, http.StatusNoContent},
		{"signed, 29s old", testKey, now.Add(-29 * time.Second), nil, http.StatusNoContent},
		{"unsigned", nil, now, nil, http.StatusUnauthorized},
		{"wrong key", otherKey, now, nil, http.StatusUnauthorized},
		{"31s old", testKey, now.Add(-31 * time.Second), nil, http.StatusUnauthorized},
		{"31s ahead", testKey, now.Add(31 * time.Second), nil, http.StatusUnauthorized},
		{"body changed", testKey, now, func(r *http.Request) { r.Body = io.NopCloser(strings.NewReader(`{"ID":2}`)) }, http.StatusUnauthorized},
		{"path changed", testKey, now, func(r *http.Request) { r.URL.Path = pathApply; r.RequestURI = pathApply }, http.StatusUnauthorized},
		{"method changed", testKey, now, func(r *http.Request) { r.Method = http.MethodPut }, http.StatusUnauthorized},
		{"time changed", testKey, now, func(r *http.Request) { r.Header.Set(HeaderTime, "1") }, http.StatusUnauthorized},
		{"mac truncated", testKey, now, func(r *http.Request) { r.Header.Set(HeaderMAC, r.Header.Get(HeaderMAC)[:10]) }, http.StatusUnauthorized},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			gotBody = ""
			req := httptest.NewRequest(http.MethodPost, pathRemove, strings.NewReader(`{"ID":1}`))
			if tt.key != nil {
				if err := SignRequest(req, tt.key, tt.signAt); err != nil {
					t.Fatal(err)
				}
			}
			if tt.tamper != nil {
				tt.tamper(req)
			}
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, req)
			if rec.Code != tt.want {
				t.Errorf("status %d, want %d (%s)", rec.Code, tt.want, rec.Body)
			}
			if tt.want == http.StatusNoContent && gotBody != `{"ID":1}` {
				t.Errorf("handler read body %q, want the signed body", gotBody)
			}
		})
	}
}

func TestPeerClientSigns(t *testing.T) {
	srv := httptest.NewServer(Authenticate(testKey, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(w, r.Body)
	})))
	defer srv.Close()
	resp, err := NewPeerClient(testKey).Post(srv.URL+"/v1/agent/x?y=1", "application/json", strings.NewReader("hello"))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || string(b) != "hello" {
		t.Errorf("signed request: %s %q, want 200 hello", resp.Status, b)
	}
	resp, err = http.Get(srv.URL + "/v1/agent/x")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("unsigned request: %s, want 401", resp.Status)
	}
	if err := SignRequest(httptest.NewRequest(http.MethodGet, "/", nil), []byte("short"), time.Now()); err == nil {
		t.Error("SignRequest accepted a 5-byte key")
	}
}
