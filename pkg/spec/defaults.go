package spec

// Default fills every unset field that has a default, in place. It is the one
// place defaults live; Load calls it before validating.
func Default(s *BudgetSet) {
	if s.Spec.TokenSource.Namespace == "" {
		s.Spec.TokenSource.Namespace = DefaultTokenMetadataNamespace
	}
	if s.Spec.TokenSource.Key == "" {
		s.Spec.TokenSource.Key = DefaultTokenMetadataKey
	}
	for i := range s.Spec.Gateways {
		if gc := s.Spec.Gateways[i].GatewayConfig; gc != nil && gc.Type == "" {
			gc.Type = DefaultGatewayConfigType
		}
	}
	for i := range s.Spec.Budgets {
		if s.Spec.Budgets[i].Mode == "" {
			s.Spec.Budgets[i].Mode = DefaultMode
		}
		if s.Spec.Budgets[i].Bucket == "" {
			s.Spec.Budgets[i].Bucket = BucketShared
		}
	}
	defaultGateways(s)
	if p := s.Spec.Pricing; p != nil && p.Currency == "" {
		p.Currency = DefaultCurrency
	}
	if f := s.Spec.Frontier; f != nil {
		if f.Header == "" {
			f.Header = DefaultModelHeader
		}
		if f.Mode == "" {
			f.Mode = DefaultMode
		}
		if f.Bucket == "" {
			f.Bucket = BucketShared
		}
	}
}
