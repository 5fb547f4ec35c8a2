package serve

import (
	"cmp"
	"encoding/json"
	"io/fs"
	"math"
	"net/http"
	"path"
	"slices"
	"sort"
	"strconv"
	"sync"
	"time"

	"github.com/fleetwatch/fleetwatch"
	"github.com/fleetwatch/fleetwatch/dashboards"
	"github.com/fleetwatch/fleetwatch/probes"
)

// statusSource is what serve gives the status page (serve's daemon implements
// it in wire.go; the tests use fixed snapshots).
type statusSource interface {
	Snapshots() []fleetwatch.Snapshot          // current snapshot of every pool
	ingested() ingestCounts                    // collector counters since start
	driftAlerts(n int) []fleetwatch.DriftAlert // latest n alerts, newest first (may be empty)
	nextReview() time.Time                     // zero when no review scheduled
	probeBudgets() []probeBudget               // backends with a probe budget or spend (may be empty)
}

// probeBudget is one backend's probe budget and spend on the page.
type probeBudget struct {
	Pool    string                 `json:"pool"`
	Backend string                 `json:"backend"`
	Status  fleetwatch.DriftStatus `json:"status"`
	// Note says which tiers the last cycle skipped for the budget ("" when
	// none); Summary is the spend in words (the line of drift status).
	Note    string               `json:"note,omitempty"`
	Summary string               `json:"summary"`
	Budget  *probes.BudgetStatus `json:"budget"`
}

// ingestCounts are the collector's counters since the process started.
type ingestCounts struct {
	Received        int64            `json:"received"` // events seen (lines of NDJSON batches included)
	Accepted        int64            `json:"accepted"`
	Rejected        int64            `json:"rejected"`
	RejectsByReason map[string]int64 `json:"rejects_by_reason"`
	Skewed          int64            `json:"skewed"`  // accepted with a clamped timestamp
	Dropped         int64            `json:"dropped"` // lost to slow-consumer limits
	// Mode is how what is published while no serve runs is kept: "core"
	// (it is not), "core + capture" or "durable intake"; Loss says what
	// is lost uncounted in that mode (health.go).
	Mode string `json:"mode"`
	Loss string `json:"loss"`
	// CaptureReplayed, CaptureUnreplayed, CaptureDeduplicated and
	// CaptureUncoveredSeconds (the capture), and IntakeLost (the durable
	// intake): what was kept, what was lost and counted, and what a
	// catch-up left out as decided on already (DECISIONS.md "No silent
	// loss", "Catch-up after a republished batch").
	CaptureReplayed         int64   `json:"capture_replayed,omitempty"`
	CaptureUnreplayed       int64   `json:"capture_unreplayed,omitempty"`
	CaptureDeduplicated     int64   `json:"capture_deduplicated,omitempty"`
	CaptureUncoveredSeconds float64 `json:"capture_uncovered_seconds,omitempty"`
	IntakeLost              int64   `json:"intake_lost,omitempty"`
}

// Status page bounds.
const (
	// defaultHistoryPoints is ten minutes at the default one-second heartbeat.
	defaultHistoryPoints = 600
	// transitionsPerBackend is how many state changes each backend keeps.
	transitionsPerBackend = 5
	// recentTransitions is how many state changes of the whole fleet the page lists.
	recentTransitions = 50
	// statusDriftAlerts is how many drift alerts the page lists.
	statusDriftAlerts = 20
	// statusTopRejects is how many reject reasons the page lists.
	statusTopRejects = 8
	// statusPagePoints is how many points per backend the page asks for
	// (?points=, SPARK_POINTS in app.js): three minutes at one heartbeat a
	// second, about one point per pixel of a sparkline, and a first
	// response a third the size of the whole history.
	statusPagePoints = 180
)

// stateCode is a state as a number, the same encoding as the
// fleetwatch_backend_state gauge (0 closed, 1 half_open, 2 open).
func stateCode(s fleetwatch.State) int8 {
	switch s {
	case fleetwatch.StateHalfOpen:
		return 1
	case fleetwatch.StateOpen:
		return 2
	case fleetwatch.StateClosed:
		return 0
	}
	return -1
}

// historyPoint is one backend's numbers at one recorded evaluation. NaN stands
// for a null of the snapshot (no sample yet).
//
// 32 bytes: float32 keeps what the page draws (TTFTs in ms, rates and
// weights to four decimals) and a uint32 counts record calls for 13 years
// of ten a second. With exact capacity a backend's ten minutes take 19 KiB
// (it took 57 KiB with float64 fields and append's doubling: the cost that
// bounded limits.max_backends; docs/DECISIONS.md "Bounded under abuse").
type historyPoint struct {
	atMs    int64  // the snapshot's At
	seq     uint32 // the record call that added it
	ewma    float32
	p95     float32
	success float32
	weight  float32
	state   int8
}

// stateTransition is one change of a backend's breaker state, as seen by
// consecutive records.
type stateTransition struct {
	Pool    string           `json:"pool"`
	Backend string           `json:"backend"`
	At      fleetwatch.Time  `json:"at"`
	From    fleetwatch.State `json:"from"`
	To      fleetwatch.State `json:"to"`
	Reason  string           `json:"reason"`
}

type seriesKey struct{ pool, backend string }

// backendSeries is a ring of the last maxPoints points of one backend.
type backendSeries struct {
	points      []historyPoint // ring; next is where the next point goes once full
	next        int
	lastState   fleetwatch.State
	lastAtMs    int64
	lastSeen    uint32 // record call that last saw the backend
	transitions []stateTransition
}

// history keeps, per backend, a bounded in-memory time series (TTFT EWMA and
// p95, success rate, weight and state at every recorded evaluation) and the
// last transitions with their reasons, for the status page's sparklines.
// Memory is bounded by maxPoints per backend; a backend that no snapshot
// names for maxPoints records is forgotten.
type history struct {
	maxPoints int

	mu     sync.Mutex // guards everything below
	seq    uint32     // number of record calls
	series map[seriesKey]*backendSeries
	recent []stateTransition // the fleet's last transitions, oldest first
}

// newHistory returns a history keeping maxPoints points per backend. If
// maxPoints <= 0, 600 is used (ten minutes at a one-second heartbeat).
func newHistory(maxPoints int) *history {
	if maxPoints <= 0 {
		maxPoints = defaultHistoryPoints
	}
	return &history{maxPoints: maxPoints, series: make(map[seriesKey]*backendSeries)}
}

func nullable(p *float64) float64 {
	if p == nil {
		return math.NaN()
	}
	return *p
}

// record adds one point per backend of snaps. Serve calls it after every
// evaluation; a snapshot recorded twice (same At) adds no second point.
func (h *history) record(snaps []fleetwatch.Snapshot) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.seq++
	for i := range snaps {
		s := &snaps[i]
		atMs := s.At.UnixMilli()
		for j := range s.Backends {
			b := &s.Backends[j]
			k := seriesKey{s.Pool, b.Backend}
			ser := h.series[k]
			if ser == nil {
				ser = &backendSeries{}
				h.series[k] = ser
			}
			ser.lastSeen = h.seq
			if len(ser.points) > 0 && atMs <= ser.lastAtMs {
				continue
			}
			if ser.lastState != "" && ser.lastState != b.State {
				t := stateTransition{Pool: s.Pool, Backend: b.Backend, At: s.At, From: ser.lastState, To: b.State, Reason: b.Reason}
				if b.Since != nil {
					t.At = *b.Since
				}
				ser.transitions = appendBounded(ser.transitions, t, transitionsPerBackend)
				h.recent = appendBounded(h.recent, t, recentTransitions)
			}
			ser.lastState, ser.lastAtMs = b.State, atMs
			p := historyPoint{
				seq: h.seq, atMs: atMs,
				ewma: float32(nullable(b.EWMATTFTMs)), p95: float32(nullable(b.P95TTFTMs)), success: float32(nullable(b.SuccessRate)),
				weight: float32(b.Weight), state: stateCode(b.State),
			}
			if ser.points == nil {
				ser.points = make([]historyPoint, 0, h.maxPoints)
			}
			if len(ser.points) < h.maxPoints {
				ser.points = append(ser.points, p)
			} else {
				ser.points[ser.next] = p
				ser.next = (ser.next + 1) % h.maxPoints
			}
		}
	}
	for k, ser := range h.series {
		if h.seq-ser.lastSeen >= uint32(h.maxPoints) {
			delete(h.series, k)
		}
	}
}

func appendBounded[T any](s []T, v T, n int) []T {
	if len(s) >= n {
		s = append(s[:0], s[len(s)-n+1:]...)
	}
	return append(s, v)
}

// statusSeries is a backend's history as columns, the shape the page
// draws. NaN (no sample) is encoded as null.
type statusSeries struct {
	T       []int64   // ms since the epoch
	EWMA    []float64 // ms
	P95     []float64 // ms
	Success []float64 // 0..1
	Weight  []float64
	State   []int8 // 0 closed, 1 half_open, 2 open
}

// MarshalJSON writes {"t":[…],"ewma":[…],"p95":[…],"ok":[…],"w":[…],"s":[…]}
// in one pass: encoding/json refuses NaN, and one marshaler per backend
// rather than one per column keeps /api/status cheap with 200 backends.
func (s statusSeries) MarshalJSON() ([]byte, error) {
	b := make([]byte, 0, 48+len(s.T)*40)
	b = append(b, `{"t":[`...)
	for i, v := range s.T {
		if i > 0 {
			b = append(b, ',')
		}
		b = strconv.AppendInt(b, v, 10)
	}
	// Rounded to what a sparkline can show: 0.1 ms, and 1e-4 of a rate.
	for _, col := range [...]struct {
		name  string
		vals  []float64
		scale float64
	}{{"ewma", s.EWMA, 10}, {"p95", s.P95, 10}, {"ok", s.Success, 1e4}, {"w", s.Weight, 1e4}} {
		b = append(b, `],"`...)
		b = append(b, col.name...)
		b = append(b, `":[`...)
		for i, v := range col.vals {
			if i > 0 {
				b = append(b, ',')
			}
			if math.IsNaN(v) || math.IsInf(v, 0) {
				b = append(b, "null"...)
				continue
			}
			b = strconv.AppendFloat(b, math.Round(v*col.scale)/col.scale, 'g', -1, 64)
		}
	}
	b = append(b, `],"s":[`...)
	for i, v := range s.State {
		if i > 0 {
			b = append(b, ',')
		}
		b = strconv.AppendInt(b, int64(v), 10)
	}
	return append(b, "]}"...), nil
}

// UnmarshalJSON reads what MarshalJSON writes (null becomes NaN), for Go
// clients of /api/status and for the tests.
func (s *statusSeries) UnmarshalJSON(data []byte) error {
	var raw struct {
		T       []int64    `json:"t"`
		EWMA    []*float64 `json:"ewma"`
		P95     []*float64 `json:"p95"`
		Success []*float64 `json:"ok"`
		Weight  []*float64 `json:"w"`
		State   []int8     `json:"s"`
	}
	if err := json.Unmarshal(data, &raw); err != nil {
		return err
	}
	floats := func(ps []*float64) []float64 {
		out := make([]float64, len(ps))
		for i, p := range ps {
			out[i] = nullable(p)
		}
		return out
	}
	*s = statusSeries{T: raw.T, EWMA: floats(raw.EWMA), P95: floats(raw.P95), Success: floats(raw.Success), Weight: floats(raw.Weight), State: raw.State}
	return nil
}

// widen turns a stored float32 back into a float64 rounded to decimals
// places (the float32's own artefacts gone: 0.3 stays 0.3); NaN stays NaN.
func widen(v float32, decimals float64) float64 {
	return math.Round(float64(v)*decimals) / decimals
}

// since returns the backend's points added after record call seq, oldest
// first, at most the newest limit of them.
func (ser *backendSeries) since(seq uint32, limit int) statusSeries {
	var out statusSeries
	n := len(ser.points)
	// Points are in record order, so the first newer one is found by
	// bisection: a page polling every second asks for one point of 600.
	first := sort.Search(n, func(i int) bool { return ser.points[(ser.next+i)%n].seq > seq })
	skip := max(first, n-limit)
	if m := n - skip; m > 0 && ser.points[(ser.next+skip)%n].seq > seq {
		out = statusSeries{
			T: make([]int64, 0, m), EWMA: make([]float64, 0, m), P95: make([]float64, 0, m),
			Success: make([]float64, 0, m), Weight: make([]float64, 0, m), State: make([]int8, 0, m),
		}
	}
	for i := skip; i < n; i++ {
		p := ser.points[(ser.next+i)%n]
		if p.seq <= seq {
			continue
		}
		out.T = append(out.T, p.atMs)
		out.EWMA = append(out.EWMA, widen(p.ewma, 1e3))
		out.P95 = append(out.P95, widen(p.p95, 1e3))
		out.Success = append(out.Success, widen(p.success, 1e4))
		out.Weight = append(out.Weight, widen(p.weight, 1e4))
		out.State = append(out.State, p.state)
	}
	return out
}

// statusBackend is one row of the page: the decision plus its history.
type statusBackend struct {
	fleetwatch.Backend
	LastChange *stateTransition `json:"last_change"`
	Series     statusSeries     `json:"series"`
}

// statusPool is one pool of the page.
type statusPool struct {
	Pool              string             `json:"pool"`
	Epoch             string             `json:"epoch"`
	Seq               uint64             `json:"seq"`
	At                fleetwatch.Time    `json:"at"`
	TTLMs             int64              `json:"ttl_ms"`
	Stale             bool               `json:"stale"`
	Mode              fleetwatch.Mode    `json:"mode"`
	AllOpen           fleetwatch.AllOpen `json:"all_open"`
	Shadow            fleetwatch.Shadow  `json:"shadow,omitempty"` // the decisions are advisory
	MedianEWMATTFTMs  *float64           `json:"median_ewma_ttft_ms"`
	AffinityTolerance float64            `json:"affinity_tolerance"`
	Backends          []statusBackend    `json:"backends"`
}

type rejectCount struct {
	Reason string `json:"reason"`
	Count  int64  `json:"count"`
}

// statusResponse is the JSON of /api/status.
type statusResponse struct {
	Instance    string                  `json:"instance"` // changes when the server restarts
	Now         fleetwatch.Time         `json:"now"`
	HistorySeq  uint64                  `json:"history_seq"` // pass as ?since= to get only newer points
	MaxPoints   int                     `json:"max_points"`  // points per backend a client should keep
	Pools       []statusPool            `json:"pools"`
	Ingest      ingestCounts            `json:"ingest"`
	TopRejects  []rejectCount           `json:"top_rejects"`
	DriftAlerts []fleetwatch.DriftAlert `json:"drift_alerts"`
	NextReview  *fleetwatch.Time        `json:"next_review"`
	// ProbeBudgets are the backends with a probe budget or a probe spend
	// in the last 24 hours.
	ProbeBudgets []probeBudget     `json:"probe_budgets"`
	Transitions  []stateTransition `json:"transitions"` // newest first
}

// status builds the page's view of snaps. Points recorded after call since
// are included (all of them for since = 0), at most the newest limit per
// backend.
func (h *history) status(snaps []fleetwatch.Snapshot, since uint64, limit int, now time.Time) ([]statusPool, uint64, []stateTransition) {
	h.mu.Lock()
	defer h.mu.Unlock()
	pools := make([]statusPool, 0, len(snaps))
	for i := range snaps {
		s := &snaps[i]
		p := statusPool{
			Pool: s.Pool, Epoch: s.Epoch, Seq: s.Seq, At: s.At, TTLMs: s.TTLMs,
			Stale: s.TTLMs > 0 && now.After(s.At.Add(time.Duration(s.TTLMs)*time.Millisecond)),
			Mode:  s.Mode, AllOpen: s.AllOpen, Shadow: s.Shadow, MedianEWMATTFTMs: s.MedianEWMATTFTMs,
			AffinityTolerance: s.AffinityTolerance,
			Backends:          make([]statusBackend, 0, len(s.Backends)),
		}
		for _, b := range s.Backends {
			row := statusBackend{Backend: b}
			if ser := h.series[seriesKey{s.Pool, b.Backend}]; ser != nil {
				row.Series = ser.since(uint32(min(since, math.MaxUint32)), limit)
				if n := len(ser.transitions); n > 0 {
					t := ser.transitions[n-1]
					row.LastChange = &t
				}
			}
			p.Backends = append(p.Backends, row)
		}
		pools = append(pools, p)
	}
	slices.SortFunc(pools, func(a, b statusPool) int { return cmp.Compare(a.Pool, b.Pool) })
	recent := slices.Clone(h.recent)
	slices.Reverse(recent)
	return pools, uint64(h.seq), recent
}

// topRejects returns the n most frequent reject reasons, most frequent first.
func topRejects(by map[string]int64, n int) []rejectCount {
	out := make([]rejectCount, 0, len(by))
	for r, c := range by {
		if c > 0 {
			out = append(out, rejectCount{r, c})
		}
	}
	slices.SortFunc(out, func(a, b rejectCount) int {
		if c := cmp.Compare(b.Count, a.Count); c != 0 {
			return c
		}
		return cmp.Compare(a.Reason, b.Reason)
	})
	if len(out) > n {
		out = out[:n]
	}
	return out
}

// statusRoutes registers the status page: "/" (the page), "/assets/" (its
// script and style sheet) and "/api/status" (the JSON it polls). The page is
// read-only: every route answers GET and HEAD only.
func statusRoutes(mux *http.ServeMux, src statusSource, h *history) {
	assets := dashboards.Status()
	instance := strconv.FormatInt(time.Now().UnixNano(), 36)

	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, r *http.Request) {
		serveAsset(w, r, assets, "index.html")
	})
	mux.HandleFunc("GET /assets/{file}", func(w http.ResponseWriter, r *http.Request) {
		name := r.PathValue("file")
		if name == "index.html" {
			http.NotFound(w, r)
			return
		}
		serveAsset(w, r, assets, name)
	})
	mux.HandleFunc("GET /api/status", func(w http.ResponseWriter, r *http.Request) {
		var since uint64
		if v := r.URL.Query().Get("since"); v != "" {
			n, err := strconv.ParseUint(v, 10, 64)
			if err != nil {
				http.Error(w, "since: not a non-negative integer", http.StatusBadRequest)
				return
			}
			since = n
		}
		limit := h.maxPoints
		if v := r.URL.Query().Get("points"); v != "" {
			n, err := strconv.Atoi(v)
			if err != nil || n < 1 {
				http.Error(w, "points: not a positive integer", http.StatusBadRequest)
				return
			}
			limit = min(n, h.maxPoints)
		}
		now := time.Now()
		resp := statusResponse{Instance: instance, Now: fleetwatch.At(now), MaxPoints: limit}
		resp.Pools, resp.HistorySeq, resp.Transitions = h.status(src.Snapshots(), since, limit, now)
		resp.Ingest = src.ingested()
		resp.TopRejects = topRejects(resp.Ingest.RejectsByReason, statusTopRejects)
		resp.DriftAlerts = src.driftAlerts(statusDriftAlerts)
		if resp.DriftAlerts == nil {
			resp.DriftAlerts = []fleetwatch.DriftAlert{}
		}
		if resp.ProbeBudgets = src.probeBudgets(); resp.ProbeBudgets == nil {
			resp.ProbeBudgets = []probeBudget{}
		}
		if next := src.nextReview(); !next.IsZero() {
			resp.NextReview = new(fleetwatch.At(next))
		}
		if resp.Transitions == nil {
			resp.Transitions = []stateTransition{}
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Cache-Control", "no-store")
		_ = json.NewEncoder(w).Encode(resp) // a failed write is the client's departure
	})
}

// contentTypes are the types of the embedded assets; the page sets
// X-Content-Type-Options so browsers never sniff.
var contentTypes = map[string]string{
	".html": "text/html; charset=utf-8",
	".js":   "text/javascript; charset=utf-8",
	".css":  "text/css; charset=utf-8",
}

func serveAsset(w http.ResponseWriter, r *http.Request, assets fs.FS, name string) {
	data, err := fs.ReadFile(assets, name)
	if err != nil {
		http.NotFound(w, r)
		return
	}
	ct, ok := contentTypes[path.Ext(name)]
	if !ok {
		http.NotFound(w, r)
		return
	}
	hdr := w.Header()
	hdr.Set("Content-Type", ct)
	hdr.Set("X-Content-Type-Options", "nosniff")
	// Only same-origin scripts, styles and fetches: the page loads nothing else.
	hdr.Set("Content-Security-Policy", "default-src 'self'; img-src 'self' data:; object-src 'none'; base-uri 'none'; frame-ancestors 'none'")
	hdr.Set("Referrer-Policy", "no-referrer")
	hdr.Set("Cache-Control", "no-cache")
	if r.Method == http.MethodHead {
		return
	}
	_, _ = w.Write(data)
}
