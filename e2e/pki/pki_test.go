package pki

import (
	"crypto/ecdsa"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"testing"
)

// TestKeys: a CA of each kind gives its own kind of key to what it issues,
// and the chain verifies.
func TestKeys(t *testing.T) {
	for _, keys := range []Keys{ECDSA, RSA} {
		ca, err := NewCAKeys(t.TempDir(), keys)
		if err != nil {
			t.Fatal(err)
		}
		p, err := ca.APIServer("apiserver")
		if err != nil {
			t.Fatal(err)
		}
		pair, err := tls.LoadX509KeyPair(p.Cert, p.Key)
		if err != nil {
			t.Fatal(err)
		}
		leaf, err := x509.ParseCertificate(pair.Certificate[0])
		if err != nil {
			t.Fatal(err)
		}
		switch k := leaf.PublicKey.(type) {
		case *rsa.PublicKey:
			if keys != RSA || k.N.BitLen() != 2048 {
				t.Errorf("%s: an RSA key of %d bits", keys, k.N.BitLen())
			}
		case *ecdsa.PublicKey:
			if keys != ECDSA {
				t.Errorf("%s: an ECDSA key", keys)
			}
		default:
			t.Errorf("%s: a key of %T", keys, k)
		}
		if _, ok := ca.key.(*rsa.PrivateKey); ok != (keys == RSA) {
			t.Errorf("%s: the CA's key is %T", keys, ca.key)
		}
		if _, err := leaf.Verify(x509.VerifyOptions{Roots: ca.Pool(), DNSName: ServiceName}); err != nil {
			t.Errorf("%s: %v", keys, err)
		}
	}
	if _, err := NewCAKeys(t.TempDir(), "dsa"); err == nil {
		t.Error("an unknown kind of key made a CA")
	}
}
