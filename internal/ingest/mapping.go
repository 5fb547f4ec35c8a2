package ingest

import (
	"strings"

	"github.com/fleetwatch/fleetwatch"
)

// Upstream is one entry of a Mapping: what a proxy calls an upstream, and
// the pool and backend fleetwatch calls it.
type Upstream struct {
	// Match is the upstream as the adapter sees it: an nginx upstream
	// address ("10.0.0.5:8000"), a HAProxy "backend/server" pair, a LiteLLM
	// api_base, an OTLP span's server address ("host:port"). URLs match
	// with or without a trailing slash.
	Match string
	// Pool replaces the pool the adapter derived; empty keeps it.
	Pool string
	// Backend replaces the backend id; empty keeps the derived one.
	Backend string
}

// Mapping turns an adapter's upstream key and derived pool into
// fleetwatch's pool and backend ids. The zero value maps every upstream to
// itself. It is read-only after NewMapping, so safe for concurrent use.
type Mapping struct {
	byMatch    map[string]Upstream
	onlyListed bool
	pool       string
}

// NewMapping builds a Mapping from entries (later entries of the same
// Match win). With onlyListed, an upstream no entry matches is skipped
// (SkipUnmapped). defaultPool names the pool of events from which the
// adapter can derive none ("" skips them: SkipNoPool).
func NewMapping(entries []Upstream, onlyListed bool, defaultPool string) *Mapping {
	m := &Mapping{byMatch: map[string]Upstream{}, onlyListed: onlyListed, pool: defaultPool}
	for _, e := range entries {
		m.byMatch[normalizeMatch(e.Match)] = e
	}
	return m
}

func normalizeMatch(s string) string { return strings.TrimRight(strings.TrimSpace(s), "/") }

// Resolve returns the pool and backend of upstream, whose pool and backend
// the adapter derived as pool and backend ("" when it could not; the
// backend then is the upstream itself), or a skip reason.
func (m *Mapping) Resolve(upstream, pool, backend string) (poolID, backendID, skip string) {
	if backend == "" {
		backend = upstream
	}
	if m != nil {
		if e, ok := m.byMatch[normalizeMatch(upstream)]; ok {
			if e.Pool != "" {
				pool = e.Pool
			}
			if e.Backend != "" {
				backend = e.Backend
			}
		} else if m.onlyListed {
			return "", "", SkipUnmapped
		}
		if pool == "" {
			pool = m.pool
		}
	}
	if pool == "" {
		return "", "", SkipNoPool
	}
	if backend == "" {
		return "", "", SkipNoUpstream
	}
	return PoolID(pool), backend, ""
}

// PoolID turns a name into a valid pool id when it is not one already:
// a model name such as "llama3:8b" or "Qwen/Qwen2.5 7B" keeps its letters,
// digits and '-', '/', '_', '=', '.', and every other byte becomes '_'
// (leading and trailing dots too), so that the pool of a model is stable.
// Ids longer than the protocol allows are left for the decoder to reject.
func PoolID(name string) string {
	if fleetwatch.ValidatePoolID(name) == nil || name == "" {
		return name
	}
	b := []byte(name)
	for i, c := range b {
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9',
			c == '-', c == '/', c == '_', c == '=':
		case c == '.' && i > 0 && i < len(b)-1 && b[i-1] != '.':
		default:
			b[i] = '_'
		}
	}
	return string(b)
}
