package service

import (
	"github.com/budgetgen/budgetgen/internal/ratelimit/key"
	"github.com/budgetgen/budgetgen/internal/ratelimit/settings"
)

func keyEncoder(s settings.Settings) key.Encoder {
	return key.Encoder{Prefix: s.CacheKeyPrefix, Format: s.KeyFormat}
}
