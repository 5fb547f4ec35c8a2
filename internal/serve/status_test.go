package serve

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fleetwatch/fleetwatch"
	"github.com/fleetwatch/fleetwatch/probes"
	"github.com/google/go-cmp/cmp"
)

// fixedStatus is a statusSource whose content the test sets.
type fixedStatus struct {
	mu      sync.Mutex // guards the fields below
	snaps   []fleetwatch.Snapshot
	ingest  ingestCounts
	alerts  []fleetwatch.DriftAlert
	next    time.Time
	budgets []probeBudget
}

func (f *fixedStatus) probeBudgets() []probeBudget {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.budgets
}

func (f *fixedStatus) set(snaps []fleetwatch.Snapshot) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.snaps = snaps
}

func (f *fixedStatus) Snapshots() []fleetwatch.Snapshot {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.snaps
}

func (f *fixedStatus) ingested() ingestCounts {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.ingest
}

func (f *fixedStatus) driftAlerts(n int) []fleetwatch.DriftAlert {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.alerts[:min(n, len(f.alerts))]
}

func (f *fixedStatus) nextReview() time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.next
}

var statusT0 = time.Date(2026, 12, 2, 7, 50, 0, 0, time.UTC)

// testBackend is a closed, healthy backend with the given EWMA TTFT.
func testBackend(id string, ewma float64) fleetwatch.Backend {
	return fleetwatch.Backend{
		Backend: id, State: fleetwatch.StateClosed, Weight: 1,
		EWMATTFTMs: new(float64(ewma)), P50TTFTMs: new(float64(ewma * 0.9)), P95TTFTMs: new(float64(ewma * 2)),
		SuccessRate: new(float64(0.99)), Rate429: new(float64(0)), Requests: 120, WindowMs: 30000,
		Drift: fleetwatch.DriftOK,
	}
}

func testSnapshot(pool string, seq uint64, at time.Time, backends ...fleetwatch.Backend) fleetwatch.Snapshot {
	return fleetwatch.Snapshot{
		V: 1, Pool: pool, Epoch: "test", Seq: seq, At: fleetwatch.At(at), TTLMs: 5000,
		Mode: fleetwatch.ModeBalance, AllOpen: fleetwatch.AllOpenShed, AffinityTolerance: 2.5,
		MedianEWMATTFTMs: new(float64(200)), Backends: backends,
	}
}

func openBackend(b fleetwatch.Backend, at time.Time, reason string) fleetwatch.Backend {
	b.State, b.Weight, b.Reason = fleetwatch.StateOpen, 0, reason
	b.OpenUntil = new(fleetwatch.At(at.Add(30 * time.Second)))
	b.Since = new(fleetwatch.At(at))
	b.SuccessRate = new(float64(0.2))
	return b
}

func TestHistoryRecord(t *testing.T) {
	h := newHistory(3)
	a := testBackend("a", 100)
	b := testBackend("b", 200)
	b.EWMATTFTMs = nil // no sample yet: a null point
	for i := range 5 {
		at := statusT0.Add(time.Duration(i) * time.Second)
		a.EWMATTFTMs = new(float64(100 + float64(i)))
		cur := a
		if i == 3 {
			cur = openBackend(a, at, "error rate 0.80 >= 0.50 over 40 requests in 30s")
		}
		h.record([]fleetwatch.Snapshot{testSnapshot("p", uint64(i), at, cur, b)})
	}
	// The same snapshot again adds nothing.
	h.record([]fleetwatch.Snapshot{testSnapshot("p", 4, statusT0.Add(4*time.Second), a, b)})

	pools, seq, recent := h.status([]fleetwatch.Snapshot{testSnapshot("p", 4, statusT0.Add(4*time.Second), a, b)}, 0, 3, statusT0.Add(4*time.Second))
	if seq != 6 {
		t.Errorf("history seq = %d, want 6", seq)
	}
	ms := func(i int) int64 { return statusT0.Add(time.Duration(i) * time.Second).UnixMilli() }
	gotA := pools[0].Backends[0].Series
	wantA := statusSeries{
		T:       []int64{ms(2), ms(3), ms(4)},
		EWMA:    []float64{102, 103, 104},
		P95:     []float64{200, 200, 200},
		Success: []float64{0.99, 0.2, 0.99},
		Weight:  []float64{1, 0, 1},
		State:   []int8{0, 2, 0},
	}
	if diff := cmp.Diff(wantA, gotA, cmp.Comparer(func(x, y float64) bool { return x == y || math.IsNaN(x) && math.IsNaN(y) })); diff != "" {
		t.Errorf("series of a, bounded to 3 points (-want +got):\n%s", diff)
	}
	gotB, err := json.Marshal(pools[0].Backends[1].Series)
	if err != nil {
		t.Fatal(err)
	}
	wantB := fmt.Sprintf(`{"t":[%d,%d,%d],"ewma":[null,null,null],"p95":[400,400,400],"ok":[0.99,0.99,0.99],"w":[1,1,1],"s":[0,0,0]}`, ms(2), ms(3), ms(4))
	if string(gotB) != wantB {
		t.Errorf("series of b (no EWMA yet) encodes as\n%s\nwant\n%s", gotB, wantB)
	}
	var back statusSeries
	if err := json.Unmarshal(gotB, &back); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(pools[0].Backends[1].Series, back, cmp.Comparer(func(x, y float64) bool { return x == y || math.IsNaN(x) && math.IsNaN(y) })); diff != "" {
		t.Errorf("series round trip (-want +got):\n%s", diff)
	}
	wantRecent := []stateTransition{
		{Pool: "p", Backend: "a", At: fleetwatch.At(statusT0.Add(4 * time.Second)), From: fleetwatch.StateOpen, To: fleetwatch.StateClosed},
		{Pool: "p", Backend: "a", At: fleetwatch.At(statusT0.Add(3 * time.Second)), From: fleetwatch.StateClosed, To: fleetwatch.StateOpen, Reason: "error rate 0.80 >= 0.50 over 40 requests in 30s"},
	}
	if diff := cmp.Diff(wantRecent, recent); diff != "" {
		t.Errorf("recent transitions, newest first (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(&wantRecent[0], pools[0].Backends[0].LastChange); diff != "" {
		t.Errorf("last change of a (-want +got):\n%s", diff)
	}

	// Incremental: only the points after record call 5.
	for _, tc := range []struct {
		since uint64
		limit int
		want  []int64
	}{
		{since: 4, limit: 3, want: []int64{ms(4)}},
		{since: 3, limit: 3, want: []int64{ms(3), ms(4)}},
		{since: 0, limit: 2, want: []int64{ms(3), ms(4)}},
		{since: 3, limit: 1, want: []int64{ms(4)}},
		{since: 6, limit: 3, want: nil},
	} {
		pools, _, _ = h.status([]fleetwatch.Snapshot{testSnapshot("p", 4, statusT0, a, b)}, tc.since, tc.limit, statusT0)
		if diff := cmp.Diff(tc.want, pools[0].Backends[0].Series.T); diff != "" {
			t.Errorf("points since record %d, at most %d (-want +got):\n%s", tc.since, tc.limit, diff)
		}
	}
}

func TestHistoryForgetsRemovedBackends(t *testing.T) {
	h := newHistory(2)
	h.record([]fleetwatch.Snapshot{testSnapshot("p", 1, statusT0, testBackend("gone", 1), testBackend("kept", 1))})
	for i := 1; i <= 2; i++ {
		h.record([]fleetwatch.Snapshot{testSnapshot("p", uint64(i+1), statusT0.Add(time.Duration(i)*time.Second), testBackend("kept", 1))})
	}
	var got []string
	for k := range h.series {
		got = append(got, k.backend)
	}
	if diff := cmp.Diff([]string{"kept"}, got); diff != "" {
		t.Errorf("backends held (-want +got):\n%s", diff)
	}
}

func TestTopRejects(t *testing.T) {
	got := topRejects(map[string]int64{"ttft_ms out of range": 3, "unknown outcome": 9, "bad json": 3, "zero": 0}, 2)
	want := []rejectCount{{"unknown outcome", 9}, {"bad json", 3}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
}

func TestStatusRoutes(t *testing.T) {
	src := &fixedStatus{
		ingest: ingestCounts{Received: 10, Accepted: 7, Rejected: 3, RejectsByReason: map[string]int64{"unknown pool": 1, "bad json": 2}},
		alerts: []fleetwatch.DriftAlert{{V: 1, Pool: "p", Backend: "b", At: fleetwatch.At(statusT0), Status: fleetwatch.DriftDrifted, Previous: fleetwatch.DriftOK, Score: 7.3, Threshold: 3}},
		next:   statusT0.Add(time.Hour),
		budgets: budgetsOf([]probes.BackendStatus{{Pool: "p", Backend: "b", Status: fleetwatch.DriftOK,
			Budget: &probes.BudgetStatus{TokensPerDay: 581, Spent: map[string]int64{probes.TierTeacher: 385}, SpentTotal: 385,
				Skipped: []string{probes.TierSampled}}}, {Pool: "p", Backend: "none", Budget: &probes.BudgetStatus{}}}),
	}
	now := time.Now()
	src.set([]fleetwatch.Snapshot{
		testSnapshot("zeta", 1, now, testBackend("z", 1)),
		testSnapshot("alpha", 1, now.Add(-time.Minute), testBackend(`<img src=x onerror=alert(1)>`, 1)),
	})
	h := newHistory(0)
	h.record(src.Snapshots())
	mux := http.NewServeMux()
	statusRoutes(mux, src, h)
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)

	tests := []struct {
		method, path string
		code         int
		ctype        string
		contains     string
	}{
		{"GET", "/", 200, "text/html; charset=utf-8", `<script src="assets/app.js">`},
		{"GET", "/assets/app.js", 200, "text/javascript; charset=utf-8", "api/status"},
		{"GET", "/assets/style.css", 200, "text/css; charset=utf-8", "--open"},
		{"HEAD", "/", 200, "text/html; charset=utf-8", ""},
		{"GET", "/assets/index.html", 404, "", ""},
		{"GET", "/assets/missing.js", 404, "", ""},
		{"GET", "/nothing", 404, "", ""},
		{"POST", "/api/status", 405, "", ""},
		{"GET", "/api/status?since=x", 400, "", ""},
		{"GET", "/api/status?points=0", 400, "", ""},
		{"GET", "/api/status?since=0&points=1", 200, "application/json", `"max_points":1`},
		{"GET", "/api/status", 200, "application/json", `"pool":"alpha"`},
		{"GET", "/api/status", 200, "application/json", `"probe_budgets":[{"pool":"p","backend":"b","status":"ok","note":"sampled tier skipped by the probe budget","summary":"385 of 581 tokens (teacher 385)`},
	}
	for _, tc := range tests {
		t.Run(tc.method+" "+tc.path, func(t *testing.T) {
			req, err := http.NewRequest(tc.method, srv.URL+tc.path, nil)
			if err != nil {
				t.Fatal(err)
			}
			res, err := srv.Client().Do(req)
			if err != nil {
				t.Fatal(err)
			}
			body, err := io.ReadAll(res.Body)
			res.Body.Close()
			if err != nil {
				t.Fatal(err)
			}
			if res.StatusCode != tc.code {
				t.Fatalf("status %d, want %d: %s", res.StatusCode, tc.code, body)
			}
			if tc.ctype != "" && res.Header.Get("Content-Type") != tc.ctype {
				t.Errorf("Content-Type %q, want %q", res.Header.Get("Content-Type"), tc.ctype)
			}
			if !strings.Contains(string(body), tc.contains) {
				t.Errorf("body does not contain %q:\n%.400s", tc.contains, body)
			}
		})
	}

	res, err := srv.Client().Get(srv.URL + "/api/status")
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	var got statusResponse
	if err := json.NewDecoder(res.Body).Decode(&got); err != nil {
		t.Fatal(err)
	}
	var pools []string
	var stale []bool
	for _, p := range got.Pools {
		pools = append(pools, p.Pool)
		stale = append(stale, p.Stale)
	}
	if diff := cmp.Diff([]string{"alpha", "zeta"}, pools); diff != "" {
		t.Errorf("pools, sorted (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]bool{true, false}, stale); diff != "" {
		t.Errorf("stale flags (ttl 5s) (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]rejectCount{{"bad json", 2}, {"unknown pool", 1}}, got.TopRejects); diff != "" {
		t.Errorf("top rejects (-want +got):\n%s", diff)
	}
	if got.NextReview == nil || !got.NextReview.Equal(src.next) || len(got.DriftAlerts) != 1 || got.HistorySeq != 1 || got.MaxPoints != defaultHistoryPoints {
		t.Errorf("next review %v, %d alerts, history seq %d, max points %d", got.NextReview, len(got.DriftAlerts), got.HistorySeq, got.MaxPoints)
	}
	if n := len(got.Pools[0].Backends[0].Series.T); n != 1 {
		t.Errorf("alpha's backend has %d points, want 1", n)
	}
}

// benchFleet is 200 backends in 4 pools with a full history of n points.
func benchFleet(b *testing.B, points int) (*history, func(i int) []fleetwatch.Snapshot) {
	b.Helper()
	snapsAt := func(i int) []fleetwatch.Snapshot {
		at := statusT0.Add(time.Duration(i) * time.Second)
		var out []fleetwatch.Snapshot
		for p := range 4 {
			backends := make([]fleetwatch.Backend, 50)
			for k := range backends {
				backends[k] = testBackend(fmt.Sprintf("gpu-%d-%02d.example:8000", p, k), 150+float64((i+k)%40))
			}
			out = append(out, testSnapshot(fmt.Sprintf("pool-%d", p), uint64(i), at, backends...))
		}
		return out
	}
	h := newHistory(points)
	for i := range points {
		h.record(snapsAt(i))
	}
	return h, snapsAt
}

// BenchmarkHistoryRecord is serve's per-heartbeat cost of the status page:
// one record of 200 backends into a full history.
func BenchmarkHistoryRecord(b *testing.B) {
	h, snapsAt := benchFleet(b, defaultHistoryPoints)
	snaps := snapsAt(defaultHistoryPoints)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		for p := range snaps {
			snaps[p].At = fleetwatch.At(statusT0.Add(time.Duration(defaultHistoryPoints+i) * time.Second))
		}
		h.record(snaps)
	}
}

// BenchmarkStatusJSON measures /api/status for 200 backends: the first
// request of a page (all 600 points per backend) and the ones it makes every
// second after (the points since its last request). The baseline is
// encoding the same snapshots alone, which is what /api/decisions costs.
func BenchmarkStatusJSON(b *testing.B) {
	h, snapsAt := benchFleet(b, defaultHistoryPoints)
	snaps := snapsAt(defaultHistoryPoints - 1)
	encode := func(b *testing.B, since uint64, limit int) {
		b.ReportAllocs()
		var n int
		for b.Loop() {
			var resp statusResponse
			resp.Pools, resp.HistorySeq, resp.Transitions = h.status(snaps, since, limit, statusT0)
			data, err := json.Marshal(resp)
			if err != nil {
				b.Fatal(err)
			}
			n = len(data)
		}
		b.ReportMetric(float64(n), "bytes/response")
	}
	b.Run("baseline-snapshots-only", func(b *testing.B) {
		b.ReportAllocs()
		var n int
		for b.Loop() {
			data, err := json.Marshal(snaps)
			if err != nil {
				b.Fatal(err)
			}
			n = len(data)
		}
		b.ReportMetric(float64(n), "bytes/response")
	})
	b.Run("full-history-600", func(b *testing.B) { encode(b, 0, defaultHistoryPoints) })
	b.Run("page-first-180", func(b *testing.B) { encode(b, 0, statusPagePoints) })
	b.Run("incremental", func(b *testing.B) { encode(b, uint64(defaultHistoryPoints-1), statusPagePoints) })
}

// TestHistoryMemoryPerBackend measures the live heap of a full history
// (defaultHistoryPoints per backend) over 2,000 backends: what a backend
// costs serve beyond the analyzer (DECISIONS.md "Bounded under abuse").
// It logs the figure, and fails outside 18.75-24 KiB a backend (18.75 KiB
// of points at exact capacity, and the maps).
func TestHistoryMemoryPerBackend(t *testing.T) {
	if testing.Short() {
		t.Skip("fills a history")
	}
	const backends = 2000
	snap := fleetwatch.Snapshot{Pool: "p"}
	for i := range backends {
		snap.Backends = append(snap.Backends, fleetwatch.Backend{Backend: fmt.Sprintf("b%05d", i), State: fleetwatch.StateClosed,
			Weight: 1, EWMATTFTMs: new(float64(180)), P95TTFTMs: new(float64(400)), SuccessRate: new(float64(0.99))})
	}
	// The points alone are 600 x 32 bytes (18.75 KiB): a figure below that
	// (the heap of goroutines left by earlier tests shrank meanwhile) or
	// above the bound is measured again, up to three times.
	var per float64
	for attempt := 1; attempt <= 3; attempt++ {
		per = historyHeapPerBackend(&snap, backends)
		t.Logf("history: %.1f KiB per backend with %d points (attempt %d)", per/1024, defaultHistoryPoints, attempt)
		if per >= 18*1024 && per <= 24*1024 {
			return
		}
	}
	t.Errorf("history: %.1f KiB per backend, want 18.75 to 24 (the points and the maps)", per/1024)
}

// historyHeapPerBackend fills a history with defaultHistoryPoints of snap
// and returns the live heap it grew by, per backend.
func historyHeapPerBackend(snap *fleetwatch.Snapshot, backends int) float64 {
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	h := newHistory(defaultHistoryPoints)
	t0 := time.Date(2026, 12, 6, 12, 0, 0, 0, time.UTC)
	for i := range defaultHistoryPoints {
		snap.At = fleetwatch.At(t0.Add(time.Duration(i) * time.Second))
		h.record([]fleetwatch.Snapshot{*snap})
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	runtime.KeepAlive(h)
	return (float64(after.HeapInuse) - float64(before.HeapInuse)) / float64(backends)
}
