package config

// Merge builds one config from the documents of several, in order, with
// every limit's scope resolved by scope (nil: none). Each part was validated
// when it was built; the merge fails only when two parts hold the same
// domain. Parts may be nil.
func Merge(scope ScopeFunc, parts ...*Config) (*Config, error) {
	var (
		docs  []*Document
		names []string
	)
	for _, p := range parts {
		if p == nil {
			continue
		}
		docs = append(docs, p.docs...)
		names = append(names, p.names...)
	}
	return BuildScoped(docs, names, scope)
}

// Scoped reports whether any limit of c has a budget scope.
func (c *Config) Scoped() bool {
	for _, l := range c.Limits() {
		if l.Scope != nil {
			return true
		}
	}
	return false
}
