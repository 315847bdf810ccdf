package settings

import (
	"errors"
	"fmt"
	"net"
	"strings"
)

// Redis topologies (REDIS_TYPE, lower-cased).
const (
	RedisSingle   = "single"
	RedisCluster  = "cluster"
	RedisSentinel = "sentinel"
)

// RedisTarget is REDIS_URL and REDIS_TYPE parsed once: where the valkey
// store connects.
type RedisTarget struct {
	// Type is RedisSingle, RedisCluster or RedisSentinel.
	Type string
	// MasterSet is the sentinel master name (the first REDIS_URL entry).
	MasterSet string
	// Addresses are host:port: the one server (single), the seeds
	// (cluster), or the sentinels.
	Addresses []string
}

// ParseRedis parses REDIS_URL (a comma list) for REDIS_TYPE. Errors name the
// setting and the entry's position, never its value when it holds
// credentials.
func ParseRedis(url, typ string) (RedisTarget, error) {
	var errs []error
	entries := strings.Split(url, ",")
	for i := range entries {
		entries[i] = strings.TrimSpace(entries[i])
	}
	for i, a := range entries {
		if strings.Contains(a, "@") {
			// Credentials never ride in REDIS_URL: the addresses are logged
			// at start and appear in connection errors, and this message
			// must not echo them either.
			errs = append(errs, fmt.Errorf("REDIS_URL: entry %d holds credentials (user:password@host); give host:port and set the password with REDIS_AUTH or REDIS_AUTH_FILE", i+1))
		}
	}
	t := RedisTarget{Type: strings.ToLower(typ)}
	hosts := entries
	switch t.Type {
	case RedisSingle:
		hosts = entries[:1]
	case RedisCluster:
	case RedisSentinel:
		if len(entries) < 2 {
			errs = append(errs, errors.New("REDIS_URL: sentinel wants <master name>,<sentinel1>,...,<sentinelN>"))
			return t, errors.Join(errs...)
		}
		t.MasterSet, hosts = entries[0], entries[1:]
	default:
		errs = append(errs, fmt.Errorf("REDIS_TYPE: %q is not single, cluster or sentinel", typ))
		return t, errors.Join(errs...)
	}
	for _, a := range entries {
		if t.Type == RedisSentinel || strings.Contains(a, "@") {
			continue // sentinel entries are names and addresses; credentials are reported above, without the value
		}
		if _, _, err := net.SplitHostPort(a); err != nil {
			errs = append(errs, fmt.Errorf("REDIS_URL: %q is not host:port", a))
		}
	}
	t.Addresses = hosts
	return t, errors.Join(errs...)
}
