package rules

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"time"
)

// Headers that carry a peer request's signature.
const (
	HeaderTime = "X-Shoal-Time" // Unix time of signing, in nanoseconds
	HeaderMAC  = "X-Shoal-MAC"  // hex HMAC-SHA256 of the request under the cluster key
)

// KeySize is the length of the cluster key.
const KeySize = 32

// MaxSkew is how far a peer request's signing time may be from the
// receiver's clock.
const MaxSkew = 30 * time.Second

// maxPeerBody bounds a peer request body read for authentication.
const maxPeerBody = 1 << 20

// requestMAC is the HMAC-SHA256 under key of the method, the request URI, the
// signing time and the body, each length-prefixed so no two requests share a
// message.
func requestMAC(key []byte, method, uri, ts string, body []byte) []byte {
	m := hmac.New(sha256.New, key)
	for _, part := range [][]byte{[]byte(method), []byte(uri), []byte(ts), body} {
		fmt.Fprintf(m, "%d:", len(part))
		m.Write(part)
	}
	return m.Sum(nil)
}

func checkKey(key []byte) error {
	if len(key) != KeySize {
		return fmt.Errorf("%w: cluster key is %d bytes, want %d", ErrInvalid, len(key), KeySize)
	}
	return nil
}

// SignRequest signs req with the cluster key at time now: it reads the body
// (and puts it back) and sets HeaderTime and HeaderMAC.
func SignRequest(req *http.Request, key []byte, now time.Time) error {
	if err := checkKey(key); err != nil {
		return err
	}
	var body []byte
	if req.Body != nil && req.Body != http.NoBody {
		b, err := io.ReadAll(req.Body)
		req.Body.Close()
		if err != nil {
			return fmt.Errorf("sign peer request: %w", err)
		}
		body = b
		req.Body = io.NopCloser(bytes.NewReader(b))
		req.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil }
		req.ContentLength = int64(len(b))
	}
	ts := strconv.FormatInt(now.UnixNano(), 10)
	req.Header.Set(HeaderTime, ts)
	req.Header.Set(HeaderMAC, hex.EncodeToString(requestMAC(key, req.Method, req.URL.RequestURI(), ts, body)))
	return nil
}

// Authenticate wraps h so that it only sees requests signed with key
// (SignRequest) within MaxSkew of now; others get 401 Unauthorized. The
// agent wraps its own peer endpoints with it too.
func Authenticate(key []byte, h http.Handler) http.Handler {
	return authenticate(key, h, time.Now, slog.Default())
}

func authenticate(key []byte, h http.Handler, now func() time.Time, log *slog.Logger) http.Handler {
	key = bytes.Clone(key)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := verify(key, r, now()); err != nil {
			log.Warn("refused peer request", "remote", r.RemoteAddr, "path", r.URL.Path, "err", err)
			http.Error(w, "unauthorized: "+err.Error(), http.StatusUnauthorized)
			return
		}
		h.ServeHTTP(w, r)
	})
}

func verify(key []byte, r *http.Request, now time.Time) error {
	if len(key) != KeySize {
		return fmt.Errorf("no valid cluster key configured")
	}
	ts := r.Header.Get(HeaderTime)
	ns, err := strconv.ParseInt(ts, 10, 64)
	if err != nil {
		return fmt.Errorf("missing or bad %s header", HeaderTime)
	}
	if skew := now.Sub(time.Unix(0, ns)); skew > MaxSkew || skew < -MaxSkew {
		return fmt.Errorf("request time is %v from ours; check the clocks (NTP)", skew.Round(time.Second))
	}
	got, err := hex.DecodeString(r.Header.Get(HeaderMAC))
	if err != nil || len(got) != sha256.Size {
		return fmt.Errorf("missing or bad %s header", HeaderMAC)
	}
	body, err := io.ReadAll(http.MaxBytesReader(nil, r.Body, maxPeerBody))
	if err != nil {
		return fmt.Errorf("read body: %w", err)
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	if !hmac.Equal(got, requestMAC(key, r.Method, r.URL.RequestURI(), ts, body)) {
		return fmt.Errorf("bad signature; is the cluster key the same on every node?")
	}
	return nil
}

// signingTransport signs every request before sending it.
type signingTransport struct {
	key  []byte
	next http.RoundTripper
	now  func() time.Time
}

// RoundTrip implements http.RoundTripper.
func (t *signingTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	req = req.Clone(req.Context()) // a RoundTripper must not modify the caller's request
	if err := SignRequest(req, t.key, t.now()); err != nil {
		return nil, err
	}
	return t.next.RoundTrip(req)
}

// NewPeerClient returns an HTTP client that signs every request with the
// cluster key, for the peer API of rules and of the agent.
func NewPeerClient(key []byte) *http.Client {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConnsPerHost = 4
	return &http.Client{
		Transport: &signingTransport{key: bytes.Clone(key), next: tr, now: time.Now},
	}
}
