package deploy

import (
	"os"
	"strings"
	"testing"

	sigsyaml "sigs.k8s.io/yaml"
)

// TestChartSentinelPasswordFromSecret: with sentinels that require a
// password of their own (REDIS_SENTINEL_AUTH; the service does not fall
// back to REDIS_AUTH for them), valkey.sentinelAuthKey mounts it from the
// Secret as the file REDIS_SENTINEL_AUTH_FILE names, never a literal in
// the Deployment; and the key is refused without valkey.type sentinel.
func TestChartSentinelPasswordFromSecret(t *testing.T) {
	const password, sentinelPassword = "valkey-pw-only-in-the-Secret", "sentinel-pw-only-in-the-Secret"
	secrets := map[string]map[string][]byte{"budgetgen-valkey": {"url": []byte("mymaster@127.0.0.1:26379"),
		"password": []byte(password + "\n"), "sentinel-password": []byte(sentinelPassword + "\n")}}
	dep, env := preparePod(t, nil, secrets, "valkey.type=sentinel", "valkey.sentinelAuthKey=sentinel-password")
	for k, want := range map[string]string{"REDIS_AUTH_FILE": password, "REDIS_SENTINEL_AUTH_FILE": sentinelPassword} {
		b, err := os.ReadFile(env[k])
		if env[k] == "" || err != nil || strings.TrimSpace(string(b)) != want {
			t.Errorf("%s=%q: %q, %v; want the Secret's key", k, env[k], b, err)
		}
	}
	y, err := sigsyaml.Marshal(dep)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(y), sentinelPassword) || strings.Contains(string(y), password) {
		t.Error("a password is in the Deployment")
	}
	helmRefuses(t, "valkey.sentinelAuthKey is set but valkey.type is single", "--values", exampleValues, "--set", "valkey.sentinelAuthKey=sentinel-password")
}
