package tlsconfig

import (
	"fmt"
	"strconv"
)

// Environment variables Envoy Gateway sets on the rate limit Deployment (the
// reference service's names).
const (
	EnvServerUseTLS = "GRPC_SERVER_USE_TLS"
	EnvServerCert   = "GRPC_SERVER_TLS_CERT"
	EnvServerKey    = "GRPC_SERVER_TLS_KEY"
	EnvServerCA     = "GRPC_SERVER_TLS_CA_CERT"

	EnvXDSUseTLS     = "CONFIG_GRPC_XDS_SERVER_USE_TLS"
	EnvXDSClientCert = "CONFIG_GRPC_XDS_CLIENT_TLS_CERT"
	EnvXDSClientKey  = "CONFIG_GRPC_XDS_CLIENT_TLS_KEY"
	EnvXDSServerCA   = "CONFIG_GRPC_XDS_SERVER_TLS_CACERT"
	EnvXDSServerSAN  = "CONFIG_GRPC_XDS_SERVER_TLS_SAN"
)

// ServerFromEnv reads the gRPC server TLS settings through getenv (os.Getenv
// in main, a map in tests). enabled is false when GRPC_SERVER_USE_TLS is unset
// or false; with it true, the certificate and key are required.
func ServerFromEnv(getenv func(string) string) (o ServerOptions, enabled bool, err error) {
	enabled, err = envBool(getenv, EnvServerUseTLS)
	if err != nil || !enabled {
		return ServerOptions{}, false, err
	}
	o = ServerOptions{CertFile: getenv(EnvServerCert), KeyFile: getenv(EnvServerKey), CAFile: getenv(EnvServerCA)}
	if o.CertFile == "" || o.KeyFile == "" {
		return o, true, fmt.Errorf("%s=true needs %s and %s", EnvServerUseTLS, EnvServerCert, EnvServerKey)
	}
	return o, true, nil
}

// XDSClientFromEnv reads the xDS client's TLS settings through getenv.
// enabled is false when CONFIG_GRPC_XDS_SERVER_USE_TLS is unset or false.
func XDSClientFromEnv(getenv func(string) string) (o ClientOptions, enabled bool, err error) {
	enabled, err = envBool(getenv, EnvXDSUseTLS)
	if err != nil || !enabled {
		return ClientOptions{}, false, err
	}
	o = ClientOptions{
		CertFile: getenv(EnvXDSClientCert), KeyFile: getenv(EnvXDSClientKey),
		CAFile: getenv(EnvXDSServerCA), ServerName: getenv(EnvXDSServerSAN),
	}
	if (o.CertFile == "") != (o.KeyFile == "") {
		return o, true, fmt.Errorf("%s and %s must be set together", EnvXDSClientCert, EnvXDSClientKey)
	}
	return o, true, nil
}

func envBool(getenv func(string) string, name string) (bool, error) {
	v := getenv(name)
	if v == "" {
		return false, nil
	}
	b, err := strconv.ParseBool(v)
	if err != nil {
		return false, fmt.Errorf("%s=%q: not a boolean", name, v)
	}
	return b, nil
}
