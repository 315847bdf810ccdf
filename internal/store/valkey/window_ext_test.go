package valkey_test

import (
	"testing"

	"github.com/budgetgen/budgetgen/internal/store"
	"github.com/budgetgen/budgetgen/internal/store/storetest/windowtest"
	"github.com/budgetgen/budgetgen/internal/store/valkey"
	"github.com/budgetgen/budgetgen/internal/valkeytest"
)

// TestWindowBehaviour: the memory store's calendar window suite against a
// real Valkey (internal/store/memory has the same test).
func TestWindowBehaviour(t *testing.T) {
	srv := valkeytest.Start(t, valkeytest.Options{})
	windowtest.Run(t, func(t *testing.T) store.Store {
		s, err := valkey.New(valkey.Options{Addresses: []string{srv.Addr}})
		if err != nil {
			t.Fatal(err)
		}
		return s
	})
}
