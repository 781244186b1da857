package kafkautil

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/sasl"
	"github.com/segmentio/kafka-go/sasl/scram"
)

// SecurityConfig is how a service reaches a Kafka that wants TLS and/or
// SASL/SCRAM, as read from the environment (each service's Config embeds
// it). The zero value is PLAINTEXT without authentication, the dev stack's.
type SecurityConfig struct {
	// TLS encrypts every connection to the brokers. Default false.
	TLS bool `env:"KAFKA_TLS" envDefault:"false"`
	// TLSCAFile is a PEM bundle of the CAs that sign the brokers'
	// certificates. Empty: the system's roots.
	TLSCAFile string `env:"KAFKA_TLS_CA_FILE"`
	// TLSCertFile and TLSKeyFile are this client's PEM certificate and key,
	// for brokers that require mutual TLS. Both or neither.
	TLSCertFile string `env:"KAFKA_TLS_CERT_FILE"`
	TLSKeyFile  string `env:"KAFKA_TLS_KEY_FILE"`
	// TLSInsecureSkipVerify accepts any broker certificate: for a test
	// cluster only, since it gives up on knowing who is at the other end.
	TLSInsecureSkipVerify bool `env:"KAFKA_TLS_INSECURE_SKIP_VERIFY" envDefault:"false"`
	// SASLMechanism is SCRAM-SHA-256 or SCRAM-SHA-512; empty means no SASL.
	// SCRAM sends no password over the wire, but use it with TLS all the
	// same: without TLS the data is readable.
	SASLMechanism string `env:"KAFKA_SASL_MECHANISM"`
	// SASLUsername and SASLPassword are the SCRAM credentials.
	SASLUsername string `env:"KAFKA_SASL_USERNAME"`
	SASLPassword string `env:"KAFKA_SASL_PASSWORD"`
}

// Security is a SecurityConfig with its files read and its mechanism
// built, ready to apply to every client: Dialer (readers, consumer groups,
// admin connections, Ping) and Transport (writers). The zero value is
// PLAINTEXT without authentication.
type Security struct {
	// TLS is nil for PLAINTEXT.
	TLS *tls.Config
	// SASL is nil without authentication.
	SASL sasl.Mechanism
}

// NewSecurity reads the files c names and builds its SASL mechanism; every
// mistake (a missing file, a certificate without its key, an unknown
// mechanism, SASL without a username) is an error at start-up rather than a
// broker that hangs up later.
func NewSecurity(c SecurityConfig) (Security, error) {
	var s Security
	tlsSet := c.TLSCAFile != "" || c.TLSCertFile != "" || c.TLSKeyFile != "" || c.TLSInsecureSkipVerify
	if tlsSet && !c.TLS {
		return s, errors.New("KAFKA_TLS_* is set but KAFKA_TLS is not true; set KAFKA_TLS=true to use TLS")
	}
	if c.TLS {
		cfg := &tls.Config{MinVersion: tls.VersionTLS12, InsecureSkipVerify: c.TLSInsecureSkipVerify} //nolint:gosec // opt-in, documented
		if c.TLSCAFile != "" {
			pem, err := os.ReadFile(c.TLSCAFile)
			if err != nil {
				return s, fmt.Errorf("reading KAFKA_TLS_CA_FILE: %w", err)
			}
			pool := x509.NewCertPool()
			if !pool.AppendCertsFromPEM(pem) {
				return s, fmt.Errorf("KAFKA_TLS_CA_FILE %s holds no PEM certificate", c.TLSCAFile)
			}
			cfg.RootCAs = pool
		}
		switch {
		case c.TLSCertFile != "" && c.TLSKeyFile != "":
			cert, err := tls.LoadX509KeyPair(c.TLSCertFile, c.TLSKeyFile)
			if err != nil {
				return s, fmt.Errorf("loading KAFKA_TLS_CERT_FILE and KAFKA_TLS_KEY_FILE: %w", err)
			}
			cfg.Certificates = []tls.Certificate{cert}
		case c.TLSCertFile != "" || c.TLSKeyFile != "":
			return s, errors.New("KAFKA_TLS_CERT_FILE and KAFKA_TLS_KEY_FILE go together: set both or neither")
		}
		s.TLS = cfg
	}
	switch m := strings.ToUpper(c.SASLMechanism); m {
	case "":
		if c.SASLUsername != "" || c.SASLPassword != "" {
			return s, errors.New("KAFKA_SASL_USERNAME/PASSWORD are set but KAFKA_SASL_MECHANISM is empty; set SCRAM-SHA-256 or SCRAM-SHA-512")
		}
	case "SCRAM-SHA-256", "SCRAM-SHA-512":
		if c.SASLUsername == "" {
			return s, fmt.Errorf("KAFKA_SASL_MECHANISM=%s needs KAFKA_SASL_USERNAME", m)
		}
		algo := scram.SHA256
		if m == "SCRAM-SHA-512" {
			algo = scram.SHA512
		}
		mech, err := scram.Mechanism(algo, c.SASLUsername, c.SASLPassword)
		if err != nil {
			return s, fmt.Errorf("building the %s mechanism: %w", m, err)
		}
		s.SASL = mech
	default:
		return s, fmt.Errorf("KAFKA_SASL_MECHANISM %q is not supported; use SCRAM-SHA-256 or SCRAM-SHA-512", c.SASLMechanism)
	}
	return s, nil
}

// Dialer returns a dialer with this security, for readers, consumer groups,
// admin connections and Ping. Each call returns a new one, so a caller may
// change its fields.
func (s Security) Dialer() *kafka.Dialer {
	return &kafka.Dialer{Timeout: 3 * time.Second, TLS: s.tlsConfig(), SASLMechanism: s.SASL}
}

// Transport returns a transport with this security and the writer settings
// of NewWriter, for writers and kafka.Client.
func (s Security) Transport() *kafka.Transport {
	return &kafka.Transport{DialTimeout: 3 * time.Second, MetadataTTL: 2 * time.Second, TLS: s.tlsConfig(), SASL: s.SASL}
}

// tlsConfig clones, because crypto/tls may not be shared with later writes.
func (s Security) tlsConfig() *tls.Config {
	if s.TLS == nil {
		return nil
	}
	return s.TLS.Clone()
}

// WriterOption changes what NewWriter builds.
type WriterOption func(*writerOptions)

type writerOptions struct{ security Security }

// WithSecurity makes the writer connect with s (TLS, SASL).
func WithSecurity(s Security) WriterOption {
	return func(o *writerOptions) { o.security = s }
}
