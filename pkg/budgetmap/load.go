package budgetmap

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"

	"gopkg.in/yaml.v3"

	"github.com/budgetgen/budgetgen/pkg/yamlpos"
)

// MaxFileSize bounds what Load reads: a map has a few entries per budget and
// Gateway, far below this.
const MaxFileSize = 4 << 20

// LoadFile reads and validates a map file.
func LoadFile(path string) (*Map, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer func() { _ = f.Close() }() // read-only
	data, err := io.ReadAll(io.LimitReader(f, MaxFileSize+1))
	if err != nil {
		return nil, fmt.Errorf("read budget map %s: %w", path, err)
	}
	return Load(data, path)
}

// Load decodes and validates one map document. Unknown fields, wrong types,
// more than one document and every semantic problem are reported with
// file:line: field; a non-nil error is a yamlpos.List.
func Load(data []byte, file string) (*Map, error) {
	if len(data) > MaxFileSize {
		return nil, yamlpos.List{{File: file, Msg: fmt.Sprintf("file is larger than %d bytes", MaxFileSize)}}
	}
	opts := yamlpos.Options{File: file, Tag: "yaml", LinesOnly: true}
	root, perr := yamlpos.One(data, opts, "BudgetMap", "budget map file")
	if perr != nil {
		return nil, yamlpos.List{perr}
	}
	var m Map
	pos, errs := yamlpos.Decode(root, &m, opts)
	if len(errs) > 0 {
		return nil, errs
	}
	if err := validate(&m, pos, file); err != nil {
		return nil, err
	}
	return &m, nil
}

type checker struct {
	file string
	pos  yamlpos.Positions
	errs yamlpos.List
}

// fail reports a problem at path's line, or its nearest parent's.
func (c *checker) fail(path, format string, args ...any) {
	c.errs = append(c.errs, &yamlpos.Error{File: c.file, Line: c.pos.Of(path).Line, Path: path, Msg: fmt.Sprintf(format, args...)})
}

func validate(m *Map, pos yamlpos.Positions, file string) error {
	c := &checker{file: file, pos: pos}
	if m.APIVersion != APIVersion {
		c.fail("apiVersion", "must be %s, got %q", APIVersion, m.APIVersion)
	}
	if m.Kind != Kind {
		c.fail("kind", "must be %s, got %q", Kind, m.Kind)
	}
	if m.BudgetSet == "" {
		c.fail("budgetSet", "is required")
	}
	seen := map[string]int{}
	bucketBudget := map[string]string{}
	for i := range m.Entries {
		e := &m.Entries[i]
		p := fmt.Sprintf("entries[%d]", i)
		if e.Domain == "" {
			c.fail(p+".domain", "is required")
		}
		if len(e.Descriptor) == 0 {
			c.fail(p+".descriptor", "needs at least one level")
		}
		for j, d := range e.Descriptor {
			if d.Key == "" {
				c.fail(fmt.Sprintf("%s.descriptor[%d].key", p, j), "is required")
			}
		}
		id := identity(e)
		if first, dup := seen[id]; dup {
			c.fail(p+".descriptor", "domain %s and this descriptor are already mapped by entries[%d]", e.Domain, first)
		} else {
			seen[id] = i
		}
		if e.Gateway.Kind != GatewayEnvoy && e.Gateway.Kind != GatewayAgentgateway {
			c.fail(p+".gateway.kind", "must be %s or %s, got %q", GatewayEnvoy, GatewayAgentgateway, e.Gateway.Kind)
		}
		if e.Gateway.Namespace == "" || e.Gateway.Name == "" {
			c.fail(p+".gateway", "namespace and name are required")
		}
		if e.Budget == "" {
			c.fail(p+".budget", "is required")
		}
		switch {
		case e.Bucket == "":
			c.fail(p+".bucket", "is required")
		case bucketBudget[e.Bucket] == "":
			bucketBudget[e.Bucket] = e.Budget
		case bucketBudget[e.Bucket] != e.Budget:
			c.fail(p+".bucket", "bucket %q already belongs to budget %q: one bucket counts one budget", e.Bucket, bucketBudget[e.Bucket])
		}
		if e.Kind != KindTokens && e.Kind != KindKillSwitch {
			c.fail(p+".kind", "must be %s or %s, got %q", KindTokens, KindKillSwitch, e.Kind)
		}
		if e.Principal.Header != "" && e.Principal.Expression != "" {
			c.fail(p+".principal", "set header or expression, not both")
		}
		if e.TokensPerDay < 0 || e.TokensPerDay > 1<<32-1 {
			c.fail(p+".tokensPerDay", "must be 0..4294967295, got %d", e.TokensPerDay)
		}
		if e.Kind == KindTokens && e.TokensPerDay == 0 {
			c.fail(p+".tokensPerDay", "must be > 0 for a token budget")
		}
		if e.Window == "" {
			c.fail(p+".window", "is required (%s, or the window of the rule's limit)", WindowDay)
		}
		if e.Mode != ModeShadow && e.Mode != ModeEnforce {
			c.fail(p+".mode", "must be %s or %s, got %q", ModeShadow, ModeEnforce, e.Mode)
		}
		if r := e.Reserve; r != nil {
			c.reserve(p+".reserve", e, r)
		}
	}
	return c.errs.Err()
}

// reserve checks one entry's reservation: a fixed number of tokens, or auto
// with an initial value, on a token budget.
func (c *checker) reserve(p string, e *Entry, r *Reserve) {
	if e.Kind != KindTokens {
		c.fail(p, "only a %s rule reserves, this one is %s", KindTokens, e.Kind)
	}
	switch {
	case r.Auto && r.Tokens != 0:
		c.fail(p+".tokens", "set tokens or auto, not both")
	case !r.Auto && r.Tokens <= 0:
		c.fail(p+".tokens", "must be > 0 (or set auto), got %d", r.Tokens)
	case !r.Auto && r.Initial != 0:
		c.fail(p+".initial", "is only for auto")
	case r.Auto && r.Initial <= 0:
		c.fail(p+".initial", "must be > 0 with auto, got %d", r.Initial)
	}
}

// identity is an unambiguous string for (domain, descriptor path).
func identity(e *Entry) string {
	var b strings.Builder
	b.WriteString(strconv.Quote(e.Domain))
	for _, d := range e.Descriptor {
		b.WriteString(" " + strconv.Quote(d.Key) + "=" + strconv.Quote(d.Value))
	}
	return b.String()
}

// Header starts every map file render writes.
const Header = "# Code generated by budgetgen render. DO NOT EDIT.\n# The budget map: which rate limit rule is which budget (ratelimit --budget-map, BUDGET_MAP_PATH).\n"

// Encode returns the map as YAML, entries sorted: the same map always gives
// the same bytes.
func Encode(m *Map) ([]byte, error) {
	c := *m
	c.Entries = slices.Clone(m.Entries)
	c.Sort()
	var b bytes.Buffer
	b.WriteString(Header)
	enc := yaml.NewEncoder(&b)
	enc.SetIndent(2)
	if err := enc.Encode(&c); err != nil {
		return nil, fmt.Errorf("encode budget map: %w", err)
	}
	if err := enc.Close(); err != nil {
		return nil, fmt.Errorf("encode budget map: %w", err)
	}
	return b.Bytes(), nil
}
