package memory_test

import (
	"testing"

	"github.com/budgetgen/budgetgen/internal/store"
	"github.com/budgetgen/budgetgen/internal/store/memory"
	"github.com/budgetgen/budgetgen/internal/store/storetest/windowtest"
)

func TestWindowBehaviour(t *testing.T) {
	windowtest.Run(t, func(t *testing.T) store.Store { return memory.New(memory.Options{}) })
}
