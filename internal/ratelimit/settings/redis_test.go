package settings

import (
	"fmt"
	"strings"
	"testing"
)

func TestParseRedis(t *testing.T) {
	for _, tc := range []struct {
		url, typ string
		want     string // fmt of the target, or "error: <substring>"
	}{
		{"valkey:6379", "SINGLE", "{single  [valkey:6379]}"},
		{" a:1 , b:2 ", "cluster", "{cluster  [a:1 b:2]}"},
		{"mymaster, s1:26379,s2:26379", "Sentinel", "{sentinel mymaster [s1:26379 s2:26379]}"},
		{"a:1,b:2", "single", "{single  [a:1]}"}, // the reference uses the first
		{"mymaster", "sentinel", "error: sentinel wants"},
		{"a:1", "ring", "error: REDIS_TYPE"},
		{"nohost", "single", `error: REDIS_URL: "nohost" is not host:port`},
		{"user:pw@h:1", "single", "error: entry 1 holds credentials"},
	} {
		got, err := ParseRedis(tc.url, tc.typ)
		s := fmt.Sprint(got)
		if err != nil {
			s = "error: " + err.Error()
		}
		if want, isErr := strings.CutPrefix(tc.want, "error: "); isErr {
			if err == nil || !strings.Contains(err.Error(), want) {
				t.Errorf("ParseRedis(%q, %q) = %s, want an error containing %q", tc.url, tc.typ, s, want)
			}
			continue
		}
		if s != tc.want {
			t.Errorf("ParseRedis(%q, %q) = %s, want %s", tc.url, tc.typ, s, tc.want)
		}
	}
}

// FuzzParseRedis: no panic, no echo of credentials, and a target without an
// error always has an address for the store to dial.
func FuzzParseRedis(f *testing.F) {
	f.Add("valkey:6379", "single")
	f.Add("m,s1:1,s2:2", "sentinel")
	f.Add("a:1,,b:2", "cluster")
	f.Add("u:secret@h:1", "cluster")
	f.Fuzz(func(t *testing.T, url, typ string) {
		got, err := ParseRedis(url, typ)
		if err != nil {
			for _, e := range strings.Split(url, ",") {
				if cred, _, ok := strings.Cut(strings.TrimSpace(e), "@"); ok && len(cred) >= 4 && strings.Contains(err.Error(), cred) {
					t.Fatalf("error echoes the credentials %q: %v", cred, err)
				}
			}
			return
		}
		if len(got.Addresses) == 0 {
			t.Fatalf("no address for %q (%q): %+v", url, typ, got)
		}
	})
}
