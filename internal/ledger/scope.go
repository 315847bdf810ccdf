package ledger

// BudgetDomain is the RuleID.Domain of a budget bucket's ledger rows: with a
// budget map the service records usage per bucket, not per Gateway's rule,
// so a report names each budget once.
const BudgetDomain = "budget"

// FromScope names the ledger rule and principal of a descriptor counted in a
// budget bucket. fromDescriptor is the principal FromDescriptor found; an
// override's own rule (fixed) names its principal instead.
func FromScope(bucket, principal string, fixed bool, fromDescriptor string) (RuleID, string) {
	r := RuleID{Domain: BudgetDomain, Rule: bucket}
	if fixed {
		return r, EncodePrincipal1(principal)
	}
	return r, fromDescriptor
}
