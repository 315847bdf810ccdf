package cli

import (
	"context"

	"github.com/budgetgen/budgetgen/internal/atomicfile"
)

func lockForTest(path string) (func(), error) { return atomicfile.Lock(context.Background(), path) }
