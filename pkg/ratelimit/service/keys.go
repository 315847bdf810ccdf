package service

import (
	"github.com/budgetgen/budgetgen/pkg/ratelimit/key"
	"github.com/budgetgen/budgetgen/pkg/ratelimit/settings"
)

func keyEncoder(s settings.Settings) key.Encoder {
	return key.Encoder{Prefix: s.CacheKeyPrefix, Format: s.KeyFormat}
}
