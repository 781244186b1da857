package kafkautil_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/onceflow/onceflow/platform/config"
	"github.com/onceflow/onceflow/platform/kafkautil"
)

// writePEM writes a self-signed CA certificate and its key to dir and
// returns their paths.
func writePEM(t *testing.T, dir string) (certFile, keyFile string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "onceflow test"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile = filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}), 0o600); err != nil {
		t.Fatal(err)
	}
	return certFile, keyFile
}

func TestSecurityFromTheEnvironment(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	cert, key := writePEM(t, dir)
	env := map[string]string{
		"KAFKA_TLS":            "true",
		"KAFKA_TLS_CA_FILE":    cert,
		"KAFKA_TLS_CERT_FILE":  cert,
		"KAFKA_TLS_KEY_FILE":   key,
		"KAFKA_SASL_MECHANISM": "SCRAM-SHA-512",
		"KAFKA_SASL_USERNAME":  "orders",
		"KAFKA_SASL_PASSWORD":  "pw",
	}
	s, err := config.KafkaSecurity(func(k string) string { return env[k] })
	if err != nil {
		t.Fatal(err)
	}
	if s.TLS == nil || s.TLS.RootCAs == nil || len(s.TLS.Certificates) != 1 || s.TLS.InsecureSkipVerify {
		t.Fatalf("TLS config = %+v, want the CA pool and the client certificate, verifying", s.TLS)
	}
	if s.SASL == nil || s.SASL.Name() != "SCRAM-SHA-512" {
		t.Fatalf("SASL = %v, want SCRAM-SHA-512", s.SASL)
	}
	d, tr := s.Dialer(), s.Transport()
	if d.TLS == nil || d.SASLMechanism == nil || tr.TLS == nil || tr.SASL == nil {
		t.Fatalf("dialer %+v / transport %+v do not carry the security", d, tr)
	}
	if d.TLS == s.TLS || tr.TLS == s.TLS {
		t.Fatal("the dialer and transport share the TLS config instead of cloning it")
	}
	w := kafkautil.NewWriter([]string{"127.0.0.1:1"}, 10, kafkautil.WithSecurity(s))
	defer w.Close()
	if wt, ok := w.Writer.Transport.(*kafka.Transport); !ok || wt.TLS == nil || wt.SASL == nil {
		t.Fatalf("NewWriter(WithSecurity) transport = %+v, want TLS and SASL", w.Writer.Transport)
	}

	env = map[string]string{"KAFKA_SASL_MECHANISM": "scram-sha-256", "KAFKA_SASL_USERNAME": "u"}
	if s, err = config.KafkaSecurity(func(k string) string { return env[k] }); err != nil || s.SASL.Name() != "SCRAM-SHA-256" || s.TLS != nil {
		t.Fatalf("SCRAM-SHA-256 without TLS = %+v, %v", s, err)
	}
	if s, err = config.KafkaSecurity(func(string) string { return "" }); err != nil || s.TLS != nil || s.SASL != nil {
		t.Fatalf("the empty environment = %+v, %v; want PLAINTEXT", s, err)
	}
}

func TestSecurityRefusesMistakes(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	cert, _ := writePEM(t, dir)
	notPEM := filepath.Join(dir, "not.pem")
	if err := os.WriteFile(notPEM, []byte("hello"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name string
		c    kafkautil.SecurityConfig
		want string
	}{
		{"CA without TLS", kafkautil.SecurityConfig{TLSCAFile: cert}, "KAFKA_TLS=true"},
		{"missing CA file", kafkautil.SecurityConfig{TLS: true, TLSCAFile: filepath.Join(dir, "nope")}, "KAFKA_TLS_CA_FILE"},
		{"CA file without PEM", kafkautil.SecurityConfig{TLS: true, TLSCAFile: notPEM}, "no PEM"},
		{"cert without key", kafkautil.SecurityConfig{TLS: true, TLSCertFile: cert}, "set both"},
		{"unknown mechanism", kafkautil.SecurityConfig{SASLMechanism: "PLAIN", SASLUsername: "u"}, "not supported"},
		{"SCRAM without user", kafkautil.SecurityConfig{SASLMechanism: "SCRAM-SHA-512"}, "KAFKA_SASL_USERNAME"},
		{"user without mechanism", kafkautil.SecurityConfig{SASLUsername: "u", SASLPassword: "p"}, "KAFKA_SASL_MECHANISM"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := kafkautil.NewSecurity(tt.c)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("NewSecurity(%+v) = %v, want an error mentioning %q", tt.c, err, tt.want)
			}
		})
	}
}
