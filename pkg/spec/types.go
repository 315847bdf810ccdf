// Package spec holds the BudgetSet spec: its Go types (the source of the JSON
// Schema), loading from YAML with file:line:field errors, validation and
// defaults, and lookups used by render, assert, promote and report.
package spec

import "github.com/budgetgen/budgetgen/pkg/yamlpos"

// APIVersion and Kind identify a BudgetSet document.
const (
	APIVersion = "budgetgen.dev/v1alpha1"
	Kind       = "BudgetSet"
)

// Defaults applied by Default (and therefore by Load).
const (
	// DefaultTokenMetadataNamespace is where Envoy AI Gateway's llmRequestCosts
	// writes the token count of a response.
	DefaultTokenMetadataNamespace = "io.envoy.ai_gateway"
	// DefaultTokenMetadataKey is the metadata key holding the total token count.
	DefaultTokenMetadataKey = "llm_total_token"
	// DefaultModelHeader is the header Envoy AI Gateway sets from the request's model.
	DefaultModelHeader = "x-ai-eg-model"
	// DefaultMode is the mode of a budget that does not say: measured, not enforced.
	DefaultMode = ModeShadow
)

// FrontierName is the budget name the frontier cap answers to in lookups
// (promote frontier, report rows). No budget in spec.budgets may use it.
const FrontierName = "frontier"

// MaxTokensPerDay is the largest daily cap Envoy Gateway can express:
// limit.requests is a uint32.
const MaxTokensPerDay = 1<<32 - 1

// Mode says whether a budget's rules deny traffic or only measure it.
type Mode string

// Modes of a budget.
const (
	// ModeShadow renders shadowMode: true: the rate limit service counts and
	// reports, Envoy never denies.
	ModeShadow Mode = "shadow"
	// ModeEnforce renders shadowMode: false: over-cap requests get 429.
	ModeEnforce Mode = "enforce"
)

// BudgetSet is the whole spec file.
type BudgetSet struct {
	APIVersion string   `json:"apiVersion" jsonschema:"enum=budgetgen.dev/v1alpha1"`
	Kind       string   `json:"kind" jsonschema:"enum=BudgetSet"`
	Metadata   Metadata `json:"metadata"`
	Spec       Spec     `json:"spec"`

	// pos maps field paths (spec.budgets[3].tokensPerDay) to source
	// positions; filled by Load, empty for a BudgetSet built in Go.
	pos  yamlpos.Positions
	file string
}

// Metadata names the spec; the name prefixes every rendered object.
type Metadata struct {
	// Name is a DNS-1123 label; rendered policies are named <name>-<gateway>.
	Name string `json:"name" jsonschema:"minLength=1,maxLength=63,pattern=^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"`
}

// Spec is what a BudgetSet asks for.
type Spec struct {
	// Gateways are the Gateways whose traffic the budgets cap. Each gets exactly
	// one BackendTrafficPolicy holding all the budgets.
	Gateways []GatewayRef `json:"gateways" jsonschema:"minItems=1"`
	// TokenSource is the dynamic metadata holding a response's token count.
	// Default: io.envoy.ai_gateway / llm_total_token.
	TokenSource TokenSource `json:"tokenSource,omitempty"`
	// Identities are the headers the gateway sets from a verified credential,
	// keyed by lowercase header name. Budgets may only key on these.
	Identities map[string]Identity `json:"identities"`
	// HeaderHygiene controls the ClientTrafficPolicy that strips client-sent
	// copies of the identity headers.
	HeaderHygiene HeaderHygiene `json:"headerHygiene,omitempty"`
	// Budgets are the per-principal and group budgets, in rule order.
	Budgets []Budget `json:"budgets,omitempty"`
	// Frontier is the spend cap on frontier models, addressable as budget "frontier".
	Frontier *Frontier `json:"frontier,omitempty"`
	// RateLimitService is where agentgateway Gateways send their rate limit
	// checks, and how they reach it. Default: the budgetgen-ratelimit Helm
	// chart's Service, envoy-gateway-system/budgetgen-ratelimit:8081, over
	// mutual TLS (docs/agentgateway.md).
	RateLimitService RateLimitService `json:"rateLimitService,omitempty"`
	// Pricing prices models for cost limits ({cost: 500, per: month}).
	Pricing *Pricing `json:"pricing,omitempty"`
}

// GatewayRef names a target Gateway.
type GatewayRef struct {
	Namespace string `json:"namespace" jsonschema:"minLength=1,maxLength=63"`
	Name      string `json:"name" jsonschema:"minLength=1,maxLength=253"`
	// SectionName optionally narrows the policy to one listener.
	SectionName string `json:"sectionName,omitempty" jsonschema:"maxLength=253"`
	// Kind is the gateway implementation: envoy (default, Envoy Gateway: a
	// BackendTrafficPolicy) or agentgateway (an AgentgatewayPolicy whose global
	// rate limit calls the ratelimit Service; see docs/agentgateway.md).
	Kind GatewayKind `json:"kind,omitempty" jsonschema:"enum=envoy,enum=agentgateway"`
	// BasePolicy is a BackendTrafficPolicy file (path relative to the spec)
	// the Gateway team owns. Render then emits one policy for the Gateway: the
	// base policy unchanged, under its own name and namespace, with the budget
	// rules appended after its own global rules (EG accepts one Gateway-level
	// BackendTrafficPolicy per Gateway).
	BasePolicy string `json:"basePolicy,omitempty" jsonschema:"minLength=1"`
	// GatewayConfig renders an Envoy AI Gateway GatewayConfig writing the
	// tokenSource key for every route of the Gateway (globalLLMRequestCosts).
	// The Gateway must reference it with the annotation
	// aigateway.envoyproxy.io/gateway-config: <name>.
	GatewayConfig *GatewayConfig `json:"gatewayConfig,omitempty"`

	// Base is the BasePolicy file's content, read by LoadFile (nil without BasePolicy).
	Base *File `json:"-"`
}

// GatewayKind is the implementation behind a target Gateway.
type GatewayKind string

// Gateway kinds.
const (
	GatewayEnvoy        GatewayKind = "envoy"
	GatewayAgentgateway GatewayKind = "agentgateway"
)

// Bucket says whether a budget's Gateways share its counters.
type Bucket string

// Buckets.
const (
	// BucketShared (default): one counter per principal across every Gateway
	// of the budget, when the service runs with the rendered budget map.
	BucketShared Bucket = "shared"
	// BucketPerGateway: each Gateway counts its own traffic against the full cap.
	BucketPerGateway Bucket = "perGateway"
)

// RateLimitService is the Service agentgateway's global rate limit calls.
type RateLimitService struct {
	// Namespace of the Service. Default: envoy-gateway-system (where Envoy
	// Gateway's own rate limit Deployment mounts the same budget map).
	Namespace string `json:"namespace,omitempty" jsonschema:"maxLength=63"`
	// Name of the Service. Default: budgetgen-ratelimit (the Helm chart's).
	// Not envoy-ratelimit: Envoy Gateway's Deployment requires client
	// certificates from Envoy Gateway's own CA, which agentgateway lacks.
	Name string `json:"name,omitempty" jsonschema:"maxLength=63"`
	// Port is the gRPC port. Default: 8081.
	Port int32 `json:"port,omitempty" jsonschema:"minimum=1,maximum=65535"`
	// TLS is how agentgateway connects. Default: mutual TLS with the chart's
	// client certificate.
	TLS RateLimitServiceTLS `json:"tls,omitempty"`
}

// TLSMode says how agentgateway connects to the rate limit Service.
type TLSMode string

// TLS modes.
const (
	// TLSMutual (default): TLS, and agentgateway presents a client
	// certificate the service verifies (GRPC_SERVER_TLS_CA_CERT).
	TLSMutual TLSMode = "mutual"
	// TLSServer: TLS verifying the service; no client certificate.
	TLSServer TLSMode = "server"
	// TLSDisabled: plaintext gRPC. Anyone who reaches the port can charge
	// or drain budgets; only the NetworkPolicy stands in the way.
	TLSDisabled TLSMode = "disabled"
)

// RateLimitServiceTLS names the Secrets agentgateway uses to reach the
// service over TLS, in the Service's namespace (agentgateway reads them
// from the namespace of the backend TLS policy render emits there).
type RateLimitServiceTLS struct {
	// Mode: mutual (default), server or disabled.
	Mode TLSMode `json:"mode,omitempty" jsonschema:"enum=mutual,enum=server,enum=disabled"`
	// ClientCertificateSecret holds agentgateway's client certificate
	// (tls.crt, tls.key); mutual mode only. Default:
	// <name>-agentgateway-client (the chart's cert-manager Certificate).
	ClientCertificateSecret string `json:"clientCertificateSecret,omitempty" jsonschema:"maxLength=253"`
	// CACertificate holds ca.crt, the CA the service's certificate chains
	// to. Default in mutual mode: the client certificate Secret (cert-manager
	// writes the issuing CA into ca.crt); required in server mode.
	CACertificate *CertificateRef `json:"caCertificate,omitempty"`
}

// CertificateRef names a ConfigMap or Secret holding ca.crt.
type CertificateRef struct {
	// Kind: Secret (default) or ConfigMap.
	Kind string `json:"kind,omitempty" jsonschema:"enum=Secret,enum=ConfigMap"`
	// Name of the object, in the Service's namespace.
	Name string `json:"name" jsonschema:"minLength=1,maxLength=253"`
}

// GatewayConfig names the Envoy AI Gateway GatewayConfig render emits.
type GatewayConfig struct {
	// Name of the GatewayConfig, in the Gateway's namespace.
	Name string `json:"name" jsonschema:"minLength=1,maxLength=253"`
	// Type of the LLM request cost written to tokenSource.key. Default: TotalToken.
	Type string `json:"type,omitempty" jsonschema:"enum=TotalToken,enum=InputToken,enum=OutputToken,enum=CachedInputToken,enum=CacheCreationInputToken,enum=ReasoningToken"`
}

// DefaultGatewayConfigType is the cost type of a rendered GatewayConfig.
const DefaultGatewayConfigType = "TotalToken"

// File is a file read next to the spec.
type File struct {
	// Path as opened (the spec's directory joined with the relative path).
	Path string
	Data []byte
}

// TokenSource is where the token count of a response is read from.
type TokenSource struct {
	// Namespace of the dynamic metadata. Default: io.envoy.ai_gateway.
	Namespace string `json:"namespace,omitempty"`
	// Key in that namespace. Default: llm_total_token.
	Key string `json:"key,omitempty"`
}

// Identity says which verified credential sets a header. Exactly one field is set.
type Identity struct {
	// JWTClaim: a SecurityPolicy JWT provider copies this claim (claimToHeaders).
	JWTClaim string `json:"jwtClaim,omitempty"`
	// APIKeyClientID: API key auth forwards the client id (forwardClientIDHeader).
	APIKeyClientID bool `json:"apiKeyClientID,omitempty"`
	// ExtAuth: an external authorization service sets it (headersToBackend).
	ExtAuth bool `json:"extAuth,omitempty"`
}

// HeaderHygiene controls the rendered ClientTrafficPolicy.
type HeaderHygiene struct {
	// UserOwned means the user maintains a ClientTrafficPolicy that removes the
	// identity headers early; budgetgen then renders none (EG accepts one per Gateway).
	UserOwned bool `json:"userOwned,omitempty"`
}

// Rollout is the shadow/enforce state shared by budgets and the frontier cap.
// promote and demote edit these fields.
type Rollout struct {
	// Mode: shadow (default) or enforce.
	Mode Mode `json:"mode,omitempty" jsonschema:"enum=shadow,enum=enforce"`
	// ShadowSince is the UTC date (YYYY-MM-DD) shadow measurement started.
	ShadowSince string `json:"shadowSince,omitempty" jsonschema:"pattern=^[0-9]{4}-[0-9]{2}-[0-9]{2}$"`
	// EnforcedSince is the UTC date (YYYY-MM-DD) the budget was promoted; set by promote.
	EnforcedSince string `json:"enforcedSince,omitempty" jsonschema:"pattern=^[0-9]{4}-[0-9]{2}-[0-9]{2}$"`
	// PromotionReason records why a promotion was forced past its checks; set by promote --force.
	PromotionReason string `json:"promotionReason,omitempty"`
}

// Budget is a per-principal or group daily token cap.
type Budget struct {
	// Name is unique in the spec (a DNS-1123 label, not "frontier").
	Name string `json:"name" jsonschema:"minLength=1,maxLength=63,pattern=^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"`
	// PerPrincipal is an identity header: one bucket per distinct value.
	// Exactly one of PerPrincipal and Group is set.
	PerPrincipal string `json:"perPrincipal,omitempty"`
	// Group is one shared bucket for requests whose header equals a value.
	Group *Group `json:"group,omitempty"`
	// TokensPerDay is the daily cap (per principal, or for the whole group),
	// shorthand for limits: [{tokens: N, per: day}]. Set it or Limits.
	TokensPerDay int64 `json:"tokensPerDay,omitempty" jsonschema:"minimum=1,maximum=4294967295"`
	// Limits are the budget's caps, one rule each; every one binds.
	Limits []Limit `json:"limits,omitempty"`
	Rollout
	Reservation
	// Overrides give named principals their own cap; per-principal budgets only.
	Overrides []Override `json:"overrides,omitempty"`
	// Gateways places the budget on some of spec.gateways only, each named
	// "<namespace>/<name>" or by a name listed once. Default: every Gateway.
	Gateways []string `json:"gateways,omitempty"`
	// Bucket: shared (default, one counter per principal across the budget's
	// Gateways) or perGateway (each Gateway its own counter).
	Bucket Bucket `json:"bucket,omitempty" jsonschema:"enum=shared,enum=perGateway"`
}

// Group selects the requests sharing one bucket.
type Group struct {
	// Header is an identity header.
	Header string `json:"header"`
	// Equals is the exact header value of the group's members.
	Equals string `json:"equals" jsonschema:"minLength=1,maxLength=1024"`
}

// Override replaces a budget's cap for one principal.
type Override struct {
	Principal string `json:"principal" jsonschema:"minLength=1,maxLength=1024"`
	// TokensPerDay is the principal's daily cap. Set it or Limits.
	TokensPerDay int64 `json:"tokensPerDay,omitempty" jsonschema:"minimum=1,maximum=4294967295"`
	// Limits replace the budget's limits for this principal.
	Limits []Limit `json:"limits,omitempty"`
}

// Frontier caps the tokens spent on frontier models, shared by everyone.
type Frontier struct {
	// Models are RE2 regular expressions matched (fully) against Header.
	Models []string `json:"models" jsonschema:"minItems=1"`
	// Header carrying the model name. Default: x-ai-eg-model.
	Header string `json:"header,omitempty"`
	// TokensPerDay is the daily cap over all frontier models together. Set it or Limits.
	TokensPerDay int64 `json:"tokensPerDay,omitempty" jsonschema:"minimum=1,maximum=4294967295"`
	// Limits are the frontier cap's windows, one rule each.
	Limits []Limit `json:"limits,omitempty"`
	Rollout
	Reservation
	// KillSwitch denies every frontier-model request (a request-count rule with
	// requests: 0, always enforced), whatever the mode.
	KillSwitch bool `json:"killSwitch,omitempty"`
	// Bucket: shared (default) or perGateway, as for budgets. The frontier cap
	// applies to Envoy Gateway Gateways only (it matches the model header).
	Bucket Bucket `json:"bucket,omitempty" jsonschema:"enum=shared,enum=perGateway"`
}

// BudgetKind tells the kinds of budget apart.
type BudgetKind string

// Budget kinds.
const (
	KindPerPrincipal BudgetKind = "perPrincipal"
	KindGroup        BudgetKind = "group"
	KindFrontier     BudgetKind = "frontier"
)

// Kind reports whether b is a per-principal or group budget.
func (b *Budget) Kind() BudgetKind {
	if b.Group != nil {
		return KindGroup
	}
	return KindPerPrincipal
}

// Header is the identity header the budget keys on.
func (b *Budget) Header() string {
	if b.Group != nil {
		return b.Group.Header
	}
	return b.PerPrincipal
}

// Enforced reports whether rules of this rollout deny traffic.
func (r *Rollout) Enforced() bool { return r.Mode == ModeEnforce }

// Source describes the credential behind an identity header, e.g. "jwtClaim:email".
func (id Identity) Source() string {
	switch {
	case id.JWTClaim != "":
		return "jwtClaim:" + id.JWTClaim
	case id.APIKeyClientID:
		return "apiKeyClientID"
	case id.ExtAuth:
		return "extAuth"
	}
	return ""
}
