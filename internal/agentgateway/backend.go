package agentgateway

import (
	"fmt"
	"regexp"
	"strconv"
)

// Backend is spec.backend (BackendFull), reduced to tls: how agentgateway
// connects to the backend the policy targets. A policy targeting a Service
// applies to every connection agentgateway makes to it, including the calls
// of a global rate limit whose backendRef names that Service (agentgateway
// controller/pkg/agentgateway/translator/testdata/references/
// service-targeted-backend-policy-via-traffic-policy.yaml shows a Service
// targeted backend TLS policy attached to a Gateway through another
// policy's backendRef).
type Backend struct {
	TLS *BackendTLS `json:"tls,omitempty"`
}

// BackendTLS is spec.backend.tls (controller/api/v1alpha1/agentgateway/
// agentgateway_policy_types.go, BackendTLS). Setting it originates TLS.
// Without SNI the name sent and verified is the destination's, which for a
// Service is the address of the endpoint agentgateway connects to
// (build_service_call in crates/agentgateway/src/proxy/httpproxy.rs,
// handshake in crates/agentgateway/src/client/tls.rs), not its DNS name.
type BackendTLS struct {
	// MtlsCertificateRef: at most one Secret of the policy's namespace whose
	// tls.crt and tls.key agentgateway presents as its client certificate.
	MtlsCertificateRef []LocalSecretRef `json:"mtlsCertificateRef,omitempty"`
	// CACertificateRefs: at most one ConfigMap (default) or Secret of the
	// policy's namespace whose ca.crt verifies the server; unset, the system
	// roots are used.
	CACertificateRefs []LocalCARef `json:"caCertificateRefs,omitempty"`
	// SNI overrides the server name sent and verified.
	SNI string `json:"sni,omitempty"`
}

// LocalSecretRef is LocalSecretObjectRef (shared_types.go): empty group and
// kind select a core Secret.
type LocalSecretRef struct {
	Name  string `json:"name"`
	Group string `json:"group,omitempty"`
	Kind  string `json:"kind,omitempty"`
}

// LocalCARef is LocalCACertificateRef: kind ConfigMap (default) or Secret.
type LocalCARef struct {
	Name string `json:"name"`
	Kind string `json:"kind,omitempty"`
}

// Kinds a CA reference may name.
const (
	CAKindConfigMap = "ConfigMap"
	CAKindSecret    = "Secret"
)

// Keys agentgateway reads from the referenced objects (BackendTLS field
// docs): the client pair from the mtlsCertificateRef Secret, the CA from
// the caCertificateRefs object.
const (
	KeyTLSCert = "tls.crt"
	KeyTLSKey  = "tls.key"
	KeyCACert  = "ca.crt"
)

// sniRE is the CRD's pattern for backend.tls.sni (a DNS name, 1..253).
var sniRE = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`)

// validateBackend applies the CRD's rules to backend.tls: tls is required
// here (budgetgen renders nothing else under backend), each list holds at
// most one reference, names are 1..253 characters, a CA kind is ConfigMap
// or Secret, an mTLS reference without a group is a Secret (a custom
// credential source names group and kind) and SNI is a DNS name.
func validateBackend(b *Backend) []FieldError {
	var errs []FieldError
	fail := func(path, format string, args ...any) {
		errs = append(errs, FieldError{Path: path, Msg: fmt.Sprintf(format, args...)})
	}
	if b.TLS == nil {
		fail("spec.backend.tls", "is required (budgetgen renders backend TLS only)")
		return errs
	}
	t := b.TLS
	const tp = "spec.backend.tls"
	if len(t.MtlsCertificateRef) > 1 {
		fail(tp+".mtlsCertificateRef", "at most 1 item, got %d", len(t.MtlsCertificateRef))
	}
	for i, r := range t.MtlsCertificateRef {
		path := tp + ".mtlsCertificateRef[" + strconv.Itoa(i) + "]"
		if n := len(r.Name); n < 1 || n > 253 {
			fail(path+".name", "is required, 1..253 characters, got %d", n)
		}
		// The CRD's rule: no group means kind is empty or Secret; a group
		// (a custom credential source) needs a kind.
		if (r.Group == "" && r.Kind != "" && r.Kind != "Secret") || (r.Group != "" && r.Kind == "") {
			fail(path, "custom credential refs must set both group and kind")
		}
	}
	if len(t.CACertificateRefs) > 1 {
		fail(tp+".caCertificateRefs", "at most 1 item, got %d", len(t.CACertificateRefs))
	}
	for i, r := range t.CACertificateRefs {
		path := tp + ".caCertificateRefs[" + strconv.Itoa(i) + "]"
		if n := len(r.Name); n < 1 || n > 253 {
			fail(path+".name", "is required, 1..253 characters, got %d", n)
		}
		if r.Kind != "" && r.Kind != CAKindConfigMap && r.Kind != CAKindSecret {
			fail(path+".kind", "must be %s or %s, got %q", CAKindConfigMap, CAKindSecret, r.Kind)
		}
	}
	if t.SNI != "" && (len(t.SNI) > 253 || !sniRE.MatchString(t.SNI)) {
		fail(tp+".sni", "must be a DNS name (%s), at most 253 characters", sniRE)
	}
	return errs
}
