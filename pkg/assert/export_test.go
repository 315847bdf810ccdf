package assert

// SetFixtureValidator lets the external test package (which may import
// pkg/assert/crd without an import cycle) give the fixture tests EG's real
// CRD validator.
func SetFixtureValidator(v Validator) { fixtureValidator = v }
