package peer

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/hkdf"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"net/netip"
	"os"
	"sync"
	"time"
)

// Raft and the peer API run over mutual TLS 1.3. Both ends present a
// certificate and check the other's against the cluster's certificate
// authorities (CAs). There are two ways to have a CA:
//
//   - Derived (the default): the CA's private key is derived from the
//     cluster key with HKDF, so every node that holds the key derives the
//     same CA, byte for byte, and issues itself a short-lived leaf at start.
//     The key file stays the one thing an operator copies. Whoever holds the
//     key can mint a certificate for any name: the key is the trust.
//   - Operator: the operator keeps a CA (`shoal tls ca create`) off the
//     nodes and gives each node a certificate for its own name (`shoal tls
//     cert create NODE`). A node then holds no key that lets it act as
//     another node.
//
// A certificate names its holder in its subject's common name.

// caInfo is the HKDF info of the derived CA's key: a new derivation gets a
// new label, never a changed one.
const caInfo = "shoal tls ca v1"

// Leaf certificates issued under a derived CA live leafLifetime and are
// reissued once less than half of it is left. They start an hour in the
// past so a peer whose clock is a little behind accepts them.
const (
	leafLifetime = 24 * time.Hour
	leafBackdate = time.Hour
)

// caEpoch fixes the derived CA's validity so every node's copy is the same.
var (
	caNotBefore = time.Date(2020, 1, 1, 0, 0, 0, 0, time.UTC)
	caNotAfter  = time.Date(2120, 1, 1, 0, 0, 0, 0, time.UTC)
)

// TLSOptions says how a node (or a tool such as `shoal drill`) gets its
// certificate and whom it trusts.
type TLSOptions struct {
	Name  string       // the node's name, put in the certificate
	Addrs []netip.Addr // this node's addresses, put in a derived leaf's SANs
	// Keys are the cluster keys, the primary first, for a derived CA. The
	// leaf is issued under the primary's CA; the CAs of all are trusted, so
	// a key rotation can add a key before any node switches to it.
	Keys [][]byte
	// CAFile, CertFile and KeyFile select the operator CA mode: the PEM
	// CA certificates to trust (several during a CA rotation), this node's
	// certificate and its private key.
	CAFile, CertFile, KeyFile string
}

// Operator reports whether o selects the operator CA mode.
func (o TLSOptions) Operator() bool { return o.CAFile != "" || o.CertFile != "" || o.KeyFile != "" }

// Certs is a node's TLS identity and the CAs it trusts, for Raft and the
// peer API. It reissues a derived leaf before it expires; Reload swaps in
// new keys or files without dropping connections.
type Certs struct {
	mu       sync.Mutex // guards everything below
	opts     TLSOptions
	roots    *x509.CertPool
	caKey    crypto.Signer     // derived mode: the primary key's CA key
	caCert   *x509.Certificate // derived mode: the primary key's CA
	leaf     *tls.Certificate
	leafKey  crypto.Signer // derived mode: kept across reissues
	now      func() time.Time
	operator bool
}

// NewCerts builds the TLS identity o describes.
func NewCerts(o TLSOptions) (*Certs, error) {
	c := &Certs{now: time.Now}
	if err := c.Reload(o); err != nil {
		return nil, err
	}
	return c, nil
}

// Reload replaces the keys or rereads the files: connections made from now
// on use them, open ones keep theirs.
func (c *Certs) Reload(o TLSOptions) error {
	if err := CheckName(o.Name); err != nil {
		return fmt.Errorf("tls: %w", err)
	}
	if o.Operator() {
		return c.loadOperator(o)
	}
	if len(o.Keys) == 0 {
		return fmt.Errorf("%w: tls: no cluster key to derive the CA from", ErrInvalid)
	}
	roots := x509.NewCertPool()
	var primaryKey crypto.Signer
	var primary *x509.Certificate
	for i, k := range o.Keys {
		ca, key, err := DeriveCA(k)
		if err != nil {
			return err
		}
		roots.AddCert(ca)
		if i == 0 {
			primary, primaryKey = ca, key
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.leafKey == nil {
		_, k, err := ed25519.GenerateKey(rand.Reader)
		if err != nil {
			return fmt.Errorf("tls: leaf key: %w", err)
		}
		c.leafKey = k
	}
	c.opts, c.roots, c.caKey, c.caCert, c.operator = o, roots, primaryKey, primary, false
	c.leaf = nil
	_, err := c.leafLocked()
	return err
}

func (c *Certs) loadOperator(o TLSOptions) error {
	if o.CAFile == "" || o.CertFile == "" || o.KeyFile == "" {
		return fmt.Errorf("%w: tls: the operator CA mode needs ca_file, cert_file and key_file", ErrInvalid)
	}
	pemCAs, err := os.ReadFile(o.CAFile)
	if err != nil {
		return fmt.Errorf("tls: %w", err)
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(pemCAs) {
		return fmt.Errorf("%w: tls: %s holds no PEM certificate", ErrInvalid, o.CAFile)
	}
	pair, err := tls.LoadX509KeyPair(o.CertFile, o.KeyFile)
	if err != nil {
		return fmt.Errorf("tls: %w", err)
	}
	leaf := pair.Leaf
	if leaf.Subject.CommonName != o.Name {
		return fmt.Errorf("%w: tls: %s is a certificate for %q, not for this node %q", ErrInvalid, o.CertFile, leaf.Subject.CommonName, o.Name)
	}
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}}); err != nil {
		return fmt.Errorf("%w: tls: %s is not valid under %s: %w", ErrInvalid, o.CertFile, o.CAFile, err)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.opts, c.roots, c.caKey, c.caCert, c.leafKey, c.leaf, c.operator = o, roots, nil, nil, nil, &pair, true
	return nil
}

// Operator reports whether the certificates come from an operator CA, in
// which case a peer's certificate proves which node it is.
func (c *Certs) Operator() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.operator
}

// Name returns the name this identity's certificate carries.
func (c *Certs) Name() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.opts.Name
}

// leafLocked returns the leaf, reissuing a derived one when it is past half
// its life. Callers hold c.mu.
func (c *Certs) leafLocked() (*tls.Certificate, error) {
	now := c.now()
	if c.leaf != nil && (c.operator || now.Before(c.leaf.Leaf.NotAfter.Add(-leafLifetime/2))) {
		return c.leaf, nil
	}
	var ips []net.IP
	for _, a := range c.opts.Addrs {
		ips = append(ips, a.AsSlice())
	}
	tmpl := &x509.Certificate{
		SerialNumber: randomSerial(),
		Subject:      pkix.Name{CommonName: c.opts.Name, Organization: []string{"shoal"}},
		IPAddresses:  ips,
		NotBefore:    now.Add(-leafBackdate),
		NotAfter:     now.Add(leafLifetime),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, c.caCert, c.leafKey.Public(), c.caKey)
	if err != nil {
		return nil, fmt.Errorf("tls: issue the leaf certificate: %w", err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("tls: issue the leaf certificate: %w", err)
	}
	c.leaf = &tls.Certificate{Certificate: [][]byte{der}, PrivateKey: c.leafKey, Leaf: leaf}
	return c.leaf, nil
}

func (c *Certs) certificate() (*tls.Certificate, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.leafLocked()
}

// verify checks a peer's chain against the trusted CAs for usage and
// returns the name it carries.
func (c *Certs) verify(chain []*x509.Certificate, usage x509.ExtKeyUsage) (string, error) {
	if len(chain) == 0 {
		return "", fmt.Errorf("%w: the peer sent no certificate", ErrAuth)
	}
	c.mu.Lock()
	roots, now := c.roots, c.now()
	c.mu.Unlock()
	inter := x509.NewCertPool()
	for _, ic := range chain[1:] {
		inter.AddCert(ic)
	}
	if _, err := chain[0].Verify(x509.VerifyOptions{Roots: roots, Intermediates: inter, CurrentTime: now, KeyUsages: []x509.ExtKeyUsage{usage}}); err != nil {
		return "", fmt.Errorf("%w: peer certificate %q: %w (is the cluster key, or the CA, the same on every node?)", ErrAuth, chain[0].Subject.CommonName, err)
	}
	name := chain[0].Subject.CommonName
	if err := CheckName(name); err != nil {
		return "", fmt.Errorf("%w: peer certificate: %w", ErrAuth, err)
	}
	return name, nil
}

// ServerConfig returns the TLS configuration of a listener: TLS 1.3 only,
// a client certificate under a trusted CA required.
func (c *Certs) ServerConfig() *tls.Config {
	return &tls.Config{
		MinVersion:     tls.VersionTLS13,
		ClientAuth:     tls.RequireAnyClientCert, // checked by VerifyConnection, against the CAs of the moment
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return c.certificate() },
		VerifyConnection: func(cs tls.ConnectionState) error {
			_, err := c.verify(cs.PeerCertificates, x509.ExtKeyUsageClientAuth)
			return err
		},
	}
}

// ClientConfig returns the TLS configuration of a dialer: TLS 1.3 only, the
// server's certificate checked against the trusted CAs. The server's
// address is not matched against its certificate: what it proves is that
// it belongs to the cluster, and callers that must know which node answers
// check PeerName.
func (c *Certs) ClientConfig() *tls.Config {
	return &tls.Config{
		MinVersion:           tls.VersionTLS13,
		InsecureSkipVerify:   true, // the chain is verified by VerifyConnection, against the CAs of the moment
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return c.certificate() },
		VerifyConnection: func(cs tls.ConnectionState) error {
			_, err := c.verify(cs.PeerCertificates, x509.ExtKeyUsageServerAuth)
			return err
		},
	}
}

// AuthError marks a failed TLS handshake as ErrAuth: the peer is not of
// this cluster (or we are not of its), which no retry will change.
func AuthError(err error) error {
	var alert tls.AlertError
	if errors.Is(err, ErrAuth) || !errors.As(err, &alert) {
		return err
	}
	return fmt.Errorf("%w: the peer refused our certificate (is the cluster key, or the CA, the same on every node?): %w", ErrAuth, err)
}

// Name returns the name in the verified certificate of a TLS peer, or
// "" when there is none.
func Name(cs *tls.ConnectionState) string {
	if cs == nil || len(cs.PeerCertificates) == 0 {
		return ""
	}
	return cs.PeerCertificates[0].Subject.CommonName
}

// DeriveCA returns the CA derived from a cluster key: every node holding
// the key gets the same certificate and key.
func DeriveCA(key []byte) (*x509.Certificate, crypto.Signer, error) {
	if err := CheckKey(key); err != nil {
		return nil, nil, err
	}
	seed, err := hkdf.Key(sha256.New, key, nil, caInfo, ed25519.SeedSize)
	if err != nil {
		return nil, nil, fmt.Errorf("derive the tls ca: %w", err)
	}
	priv := ed25519.NewKeyFromSeed(seed)
	pub := priv.Public().(ed25519.PublicKey)
	id := sha256.Sum256(pub)
	tmpl := &x509.Certificate{
		SerialNumber:          new(big.Int).SetBytes(id[:16]),
		Subject:               pkix.Name{CommonName: "shoal cluster CA " + hex.EncodeToString(id[:4]), Organization: []string{"shoal"}},
		NotBefore:             caNotBefore,
		NotAfter:              caNotAfter,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
		SubjectKeyId:          id[:20],
	}
	// Ed25519 signatures are deterministic, so the certificate is too.
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, pub, priv)
	if err != nil {
		return nil, nil, fmt.Errorf("derive the tls ca: %w", err)
	}
	ca, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, nil, fmt.Errorf("derive the tls ca: %w", err)
	}
	return ca, priv, nil
}

func randomSerial() *big.Int {
	b := make([]byte, 16)
	rand.Read(b)
	b[0] &= 0x7f
	return new(big.Int).SetBytes(b)
}

// CA is an operator's certificate authority: its certificate and key.
type CA struct {
	Cert *x509.Certificate
	Key  crypto.Signer
}

// CreateCA makes a new operator CA (ECDSA P-256) valid for the given time.
func CreateCA(name string, validFor time.Duration, now time.Time) (*CA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("create ca: %w", err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          randomSerial(),
		Subject:               pkix.Name{CommonName: name, Organization: []string{"shoal"}},
		NotBefore:             now.Add(-leafBackdate),
		NotAfter:              now.Add(validFor),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, fmt.Errorf("create ca: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("create ca: %w", err)
	}
	return &CA{Cert: cert, Key: key}, nil
}

// Issue makes a certificate for node name (usable as client and server)
// with a fresh ECDSA P-256 key, valid for the given time.
func (ca *CA) Issue(name string, addrs []netip.Addr, validFor time.Duration, now time.Time) (*x509.Certificate, crypto.Signer, error) {
	if err := CheckName(name); err != nil {
		return nil, nil, err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, fmt.Errorf("issue %s: %w", name, err)
	}
	var ips []net.IP
	for _, a := range addrs {
		ips = append(ips, a.AsSlice())
	}
	tmpl := &x509.Certificate{
		SerialNumber: randomSerial(),
		Subject:      pkix.Name{CommonName: name, Organization: []string{"shoal"}},
		IPAddresses:  ips,
		NotBefore:    now.Add(-leafBackdate),
		NotAfter:     now.Add(validFor),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, key.Public(), ca.Key)
	if err != nil {
		return nil, nil, fmt.Errorf("issue %s: %w", name, err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, nil, fmt.Errorf("issue %s: %w", name, err)
	}
	return cert, key, nil
}

// EncodeCertPEM returns a certificate as PEM.
func EncodeCertPEM(c *x509.Certificate) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.Raw})
}

// EncodeKeyPEM returns a private key as PKCS #8 PEM.
func EncodeKeyPEM(k crypto.Signer) ([]byte, error) {
	der, err := x509.MarshalPKCS8PrivateKey(k)
	if err != nil {
		return nil, fmt.Errorf("encode key: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), nil
}

// LoadCA reads an operator CA's certificate and key from PEM files.
func LoadCA(certFile, keyFile string) (*CA, error) {
	pair, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return nil, fmt.Errorf("load ca: %w", err)
	}
	if !pair.Leaf.IsCA {
		return nil, fmt.Errorf("%w: load ca: %s is not a CA certificate", ErrInvalid, certFile)
	}
	key, ok := pair.PrivateKey.(crypto.Signer)
	if !ok {
		return nil, fmt.Errorf("%w: load ca: %s holds no signing key", ErrInvalid, keyFile)
	}
	return &CA{Cert: pair.Leaf, Key: key}, nil
}
