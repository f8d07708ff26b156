// Package pki writes the certificates and keys a small test control plane
// needs: one CA, serving certificates for each API server, a service-account
// key pair and client certificates. Everything is generated in memory with
// crypto/x509 and written as PEM files into one directory; nothing is
// fetched and nothing outlives the test that made it.
package pki

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// ServiceName is the name every API server certificate carries and the one
// extractedprism verifies (its discovery client and the readyz probe).
const ServiceName = "kubernetes.default.svc"

// ServiceIP is the first address of the service range the API servers are
// started with. It only appears as a SAN string; nothing ever dials it.
const ServiceIP = "10.96.0.1"

// CA is a certificate authority that signs the other certificates.
type CA struct {
	Dir     string // where the files are written
	CertPEM []byte
	cert    *x509.Certificate
	key     crypto.Signer
	keys    Keys
}

// Keys is the kind of key pair a CA has and gives the certificates it
// issues: ECDSA P-256 (the zero value) or RSA-2048, kubeadm's default,
// whose signatures cost a TLS server several times more CPU.
type Keys string

const (
	ECDSA Keys = "ecdsa"
	RSA   Keys = "rsa"
)

// generate makes a key pair of kind k.
func (k Keys) generate() (crypto.Signer, error) {
	switch k {
	case "", ECDSA:
		return ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	case RSA:
		return rsa.GenerateKey(rand.Reader, 2048)
	}
	return nil, fmt.Errorf("keys %q: want %q or %q", k, ECDSA, RSA)
}

// Pair names the files of one certificate and its key.
type Pair struct {
	Cert, Key string
}

// NewCA creates a CA with ECDSA keys and writes it to dir/ca.crt and
// dir/ca.key.
func NewCA(dir string) (*CA, error) { return NewCAKeys(dir, ECDSA) }

// NewCAKeys is NewCA with keys of the given kind, for the CA and every
// certificate it issues.
func NewCAKeys(dir string, keys Keys) (*CA, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	key, err := keys.generate()
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: "extractedprism-e2e-ca"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(30 * 24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, fmt.Errorf("create CA certificate: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	ca := &CA{Dir: dir, cert: cert, key: key, keys: keys, CertPEM: pemBlock("CERTIFICATE", der)}
	if err := os.WriteFile(ca.CertFile(), ca.CertPEM, 0o644); err != nil {
		return nil, err
	}
	if err := writeKey(filepath.Join(dir, "ca.key"), key); err != nil {
		return nil, err
	}
	return ca, nil
}

// CertFile is the path of the CA certificate.
func (ca *CA) CertFile() string { return filepath.Join(ca.Dir, "ca.crt") }

// Pool returns a certificate pool holding only this CA.
func (ca *CA) Pool() *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(ca.cert)
	return p
}

// Serving issues a server certificate named name.crt/name.key for the
// given IP addresses and DNS names.
func (ca *CA) Serving(name string, ips []string, dnsNames []string) (Pair, error) {
	tmpl := &x509.Certificate{
		Subject:     pkix.Name{CommonName: name},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		DNSNames:    dnsNames,
	}
	for _, s := range ips {
		ip := net.ParseIP(s)
		if ip == nil {
			return Pair{}, fmt.Errorf("serving certificate %s: %q is not an IP address", name, s)
		}
		tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
	}
	return ca.issue(name, tmpl)
}

// APIServer issues the serving certificate of one API server: its node
// address, loopback, the in-cluster service names and the service IP.
func (ca *CA) APIServer(name string, nodeIPs ...string) (Pair, error) {
	ips := append([]string{"127.0.0.1", ServiceIP}, nodeIPs...)
	dns := []string{"kubernetes", "kubernetes.default", ServiceName, ServiceName + ".cluster.local", "localhost"}
	return ca.Serving(name, ips, dns)
}

// Client issues a client certificate with the given user name and groups
// (the API server reads CN as the user and O as the groups).
func (ca *CA) Client(name, user string, groups ...string) (Pair, error) {
	tmpl := &x509.Certificate{
		Subject:     pkix.Name{CommonName: user, Organization: groups},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	return ca.issue(name, tmpl)
}

func (ca *CA) issue(name string, tmpl *x509.Certificate) (Pair, error) {
	der, key, err := ca.sign(name, tmpl, time.Now().Add(7*24*time.Hour))
	if err != nil {
		return Pair{}, err
	}
	p := Pair{Cert: filepath.Join(ca.Dir, name+".crt"), Key: filepath.Join(ca.Dir, name+".key")}
	if err := os.WriteFile(p.Cert, pemBlock("CERTIFICATE", der), 0o644); err != nil {
		return Pair{}, err
	}
	return p, writeKey(p.Key, key)
}

// sign signs tmpl, valid until notAfter, for a new key pair.
func (ca *CA) sign(name string, tmpl *x509.Certificate, notAfter time.Time) ([]byte, crypto.Signer, error) {
	key, err := ca.keys.generate()
	if err != nil {
		return nil, nil, err
	}
	tmpl.SerialNumber = serial()
	tmpl.NotBefore = time.Now().Add(-time.Hour)
	tmpl.NotAfter = notAfter
	tmpl.KeyUsage = x509.KeyUsageDigitalSignature
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, key.Public(), ca.key)
	if err != nil {
		return nil, nil, fmt.Errorf("create certificate %s: %w", name, err)
	}
	return der, key, nil
}

// NodeClient writes to path a node's client certificate as the kubelet
// keeps it (kubelet-client-<time>.pem): user system:node:<node>, group
// system:nodes, certificate and key in one file, valid until notAfter.
func (ca *CA) NodeClient(path, node string, notAfter time.Time) error {
	tmpl := &x509.Certificate{
		Subject:     pkix.Name{CommonName: "system:node:" + node, Organization: []string{"system:nodes"}},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	der, key, err := ca.sign(path, tmpl, notAfter)
	if err != nil {
		return err
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(pemBlock("CERTIFICATE", der), pemBlock("PRIVATE KEY", keyDER)...), 0o600)
}

// ServiceAccountKeys writes an ECDSA P-256 key pair for signing
// service-account tokens (ES256) as dir/sa.key and dir/sa.pub.
func ServiceAccountKeys(dir string) (Pair, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return Pair{}, err
	}
	pub, err := x509.MarshalPKIXPublicKey(key.Public())
	if err != nil {
		return Pair{}, err
	}
	p := Pair{Cert: filepath.Join(dir, "sa.pub"), Key: filepath.Join(dir, "sa.key")}
	if err := os.WriteFile(p.Cert, pemBlock("PUBLIC KEY", pub), 0o644); err != nil {
		return Pair{}, err
	}
	return p, writeKey(p.Key, key)
}

func writeKey(path string, key crypto.Signer) error {
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return err
	}
	return os.WriteFile(path, pemBlock("PRIVATE KEY", der), 0o600)
}

func pemBlock(kind string, der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: kind, Bytes: der})
}

func serial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 120))
	if err != nil {
		// crypto/rand does not fail on Linux; a fixed serial would still
		// give a usable (if not unique) certificate.
		return big.NewInt(time.Now().UnixNano())
	}
	return n
}
