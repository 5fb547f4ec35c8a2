package serve

import (
	"github.com/fleetwatch/fleetwatch/internal/config"
	"github.com/fleetwatch/fleetwatch/internal/ingest"
)

// DefaultIngestSource is the source of the events the ingest adapters
// publish when ingest.source is not set.
const DefaultIngestSource = "fleetwatch-ingest"

// IngestMapping is the adapters' upstream mapping of cfg (configured
// backends' URLs, then ingest.upstreams).
func IngestMapping(cfg *config.Config) *ingest.Mapping {
	var entries []ingest.Upstream
	for _, u := range cfg.IngestUpstreams() {
		entries = append(entries, ingest.Upstream{Match: u.Match, Pool: u.Pool, Backend: u.Backend})
	}
	return ingest.NewMapping(entries, cfg.Ingest.OnlyListed, cfg.Ingest.DefaultPool)
}

// newIngestHTTP builds the HTTP ingest adapters (POST /v1/outcomes,
// /v1/ingest/litellm, /v1/traces): they publish on the outcome subjects
// through serve's own connection, so their events take the collector's
// path like any publisher's.
func (s *Server) newIngestHTTP() *ingest.HTTP {
	source := s.cfg.Ingest.Source
	if source == "" {
		source = DefaultIngestSource
	}
	in := s.cfg.Ingest
	return ingest.NewHTTP(ingest.HTTPSettings{
		Emitter: ingest.NewEmitter(s.nc, ingest.EmitterSettings{Prefix: s.cfg.Prefix, Source: source}),
		Mapping: IngestMapping(s.cfg),
		MaxBody: in.MaxBodyBytes,
		LiteLLM: ingest.LiteLLMSettings{PoolField: in.LiteLLM.PoolField, BackendField: in.LiteLLM.BackendField},
		OTLP: ingest.OTLPSettings{
			PoolAttribute: in.OTLP.PoolAttribute, BackendAttribute: in.OTLP.BackendAttribute,
			TTFTAttributes: in.OTLP.TTFTAttributes, TTFTEvents: in.OTLP.TTFTEvents,
		},
		Metrics: s.metrics,
	})
}
