package serve

import (
	"github.com/fleetwatch/fleetwatch/internal/ingest"
)

// newIngestHTTP builds the HTTP ingest adapters (POST /v1/outcomes,
// /v1/ingest/litellm, /v1/traces) from the file's settings
// (config.IngestHTTPSettings): they publish on the outcome subjects
// through serve's own connection, so their events take the collector's
// path like any publisher's.
func (s *Server) newIngestHTTP() *ingest.HTTP {
	hs := s.cfg.IngestHTTPSettings()
	hs.Emitter = ingest.NewEmitter(s.nc, s.cfg.IngestEmitterSettings(""))
	hs.Metrics = s.metrics
	return ingest.NewHTTP(hs)
}
