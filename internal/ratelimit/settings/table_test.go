package settings

import (
	"bytes"
	"io"
	"strings"
	"testing"
	"time"
)

// TestTableNamesEachSettingOnce: no environment variable or flag is bound
// twice, every setting has a doc, and -help shows each flag with its
// environment variables.
func TestTableNamesEachSettingOnce(t *testing.T) {
	s := Defaults()
	var r raw
	envs, flags := map[string]bool{}, map[string]bool{}
	for _, st := range table(&s, &r) {
		if st.doc == "" || (len(st.env) == 0 && st.flag == "") {
			t.Errorf("setting %v/%q has no doc or no name", st.env, st.flag)
		}
		for _, e := range st.env {
			if envs[e] {
				t.Errorf("%s bound twice", e)
			}
			envs[e] = true
		}
		if st.flag != "" {
			if flags[st.flag] {
				t.Errorf("flag %s bound twice", st.flag)
			}
			flags[st.flag] = true
		}
	}
	var help bytes.Buffer
	if _, err := Load([]string{"-help"}, envOf(nil), &help); err == nil {
		t.Fatal("-help did not stop Load")
	}
	for _, want := range []string{"-redis-url", "(REDIS_URL)", "-store-timeout", "(STORE_TIMEOUT)", "-config-dir"} {
		if !strings.Contains(help.String(), want) {
			t.Errorf("-help lacks %q:\n%s", want, help.String())
		}
	}
}

// TestTableValues: each kind of value parses from env and flags alike, a
// boolean flag needs no value, and the alias of Envoy Gateway wins.
func TestTableValues(t *testing.T) {
	s, err := Load([]string{"--shadow-mode", "--store-timeout", "40ms", "--near-limit-ratio", "0.5"},
		envOf(map[string]string{"GRPC_CLIENT_TLS_CACERT": "/ref", "GRPC_SERVER_TLS_CA_CERT": "/eg", "EXPIRATION_JITTER_MAX_SECONDS": " 60 ", "CONFIG_POLL_INTERVAL": "2s"}), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if !s.ShadowMode || s.StoreTimeout != 40*time.Millisecond || s.NearLimitRatio != 0.5 || s.GRPCClientTLSCACert != "/eg" ||
		s.Grace != time.Minute || s.ConfigPollInterval != 2*time.Second {
		t.Fatalf("%+v", s)
	}
	if _, err := Load(nil, envOf(map[string]string{"STORE_TIMEOUT": "soon"}), io.Discard); err == nil || !strings.Contains(err.Error(), `STORE_TIMEOUT: not a duration: "soon"`) {
		t.Fatalf("err = %v", err)
	}
}
