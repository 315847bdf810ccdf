package settings

import (
	"io"
	"strings"
	"testing"
)

func TestLedgerRetentionDays(t *testing.T) {
	s, err := Load(nil, envOf(nil), io.Discard)
	if err != nil || s.LedgerRetentionDays != 10 {
		t.Fatalf("default: %d %v", s.LedgerRetentionDays, err)
	}
	s, err = Load(nil, envOf(map[string]string{"LEDGER_RETENTION_DAYS": "30"}), io.Discard)
	if err != nil || s.LedgerRetentionDays != 30 {
		t.Fatalf("env: %d %v", s.LedgerRetentionDays, err)
	}
	s, err = Load([]string{"--ledger-retention-days", "8"}, envOf(nil), io.Discard)
	if err != nil || s.LedgerRetentionDays != 8 {
		t.Fatalf("flag: %d %v", s.LedgerRetentionDays, err)
	}
	for _, bad := range []string{"7", "93", "0", "-1"} {
		_, err := Load(nil, envOf(map[string]string{"LEDGER_RETENTION_DAYS": bad}), io.Discard)
		if err == nil || !strings.Contains(err.Error(), "LEDGER_RETENTION_DAYS") {
			t.Errorf("%s accepted: %v", bad, err)
		}
	}
}
