package spec

import (
	"errors"
	"strings"
	"testing"
)

// TestReadAllBounded: ReadAll and ReadFile stop after MaxFileBytes and
// return ErrTooLarge; Load refuses such bytes with the file's name.
func TestReadAllBounded(t *testing.T) {
	big := strings.NewReader(strings.Repeat("#", MaxFileBytes+1))
	if _, err := ReadAll(big); !errors.Is(err, ErrTooLarge) {
		t.Errorf("ReadAll of MaxFileBytes+1: %v, want ErrTooLarge", err)
	}
	if big.Len() != 0 {
		t.Errorf("ReadAll left %d bytes unread, want it to read MaxFileBytes+1 and stop", big.Len())
	}
	if b, err := ReadAll(strings.NewReader("ok")); err != nil || string(b) != "ok" {
		t.Errorf("ReadAll(\"ok\") = %q, %v", b, err)
	}
	_, err := Load(make([]byte, MaxFileBytes+1), "huge.yaml")
	if err == nil || !strings.Contains(err.Error(), "huge.yaml") || !strings.Contains(err.Error(), "file too large") {
		t.Errorf("Load of MaxFileBytes+1: %v, want an error naming huge.yaml", err)
	}
}
