package fleetwatch

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// protocolSnapshot is the decision snapshot of PROTOCOL.md, verbatim.
const protocolSnapshot = `{
  "v": 1,
  "pool": "llama-3.1-70b",
  "epoch": "01JB4X…",
  "seq": 1234,
  "at": "2026-12-02T07:50:01.000Z",
  "ttl_ms": 5000,
  "mode": "balance",
  "all_open": "shed",
  "median_ewma_ttft_ms": 210.0,
  "affinity_tolerance": 2.5,
  "backends": [
    {
      "backend": "vllm-a",
      "state": "closed",
      "weight": 1.0,
      "priority": 0,
      "ewma_ttft_ms": 200.1,
      "p50_ttft_ms": 180.0,
      "p95_ttft_ms": 540.0,
      "success_rate": 0.995,
      "rate_429": 0.0,
      "requests": 420,
      "window_ms": 30000,
      "open_until": null,
      "reason": "",
      "drift": "ok",
      "cost_per_mtok": 0.6
    }
  ]
}`

func TestSnapshotProtocolExample(t *testing.T) {
	var got Snapshot
	if err := json.Unmarshal([]byte(protocolSnapshot), &got); err != nil {
		t.Fatal(err)
	}
	want := Snapshot{
		V: 1, Pool: "llama-3.1-70b", Epoch: "01JB4X…", Seq: 1234,
		At: At(time.Date(2026, 12, 2, 7, 50, 1, 0, time.UTC)), TTLMs: 5000,
		Mode: ModeBalance, AllOpen: AllOpenShed, MedianEWMATTFTMs: new(float64(210)), AffinityTolerance: 2.5,
		Backends: []Backend{{
			Backend: "vllm-a", State: StateClosed, Weight: 1, Priority: 0,
			EWMATTFTMs: new(float64(200.1)), P50TTFTMs: new(float64(180)), P95TTFTMs: new(float64(540)),
			SuccessRate: new(float64(0.995)), Rate429: new(float64(0)), Requests: 420, WindowMs: 30000,
			Drift: DriftOK, CostPerMTok: new(float64(0.6)),
		}},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("Unmarshal (-want +got):\n%s", diff)
	}
}

func TestSnapshotJSONRoundTrip(t *testing.T) {
	at := time.Date(2026, 12, 2, 7, 50, 1, 250e6, time.UTC)
	tests := []struct {
		name string
		s    Snapshot
	}{
		{"empty pool", Snapshot{V: 1, Pool: "p", Epoch: "e", At: At(at), Mode: ModeFailover, AllOpen: AllOpenSpread, Backends: []Backend{}}},
		{"open and half-open backends", Snapshot{
			V: 1, Pool: "meta-llama/Llama-3.1-70B-Instruct", Epoch: "01JB4X", Seq: 7, At: At(at), TTLMs: 5000,
			Mode: ModeBalance, AllOpen: AllOpenShed, MedianEWMATTFTMs: new(float64(210)), AffinityTolerance: DefaultAffinityTolerance,
			Backends: []Backend{
				{Backend: "a", State: StateOpen, OpenUntil: new(At(at.Add(30 * time.Second))),
					Reason: "error rate 0.42 >= 0.25 over 120 requests in 30s", Drift: DriftUnknown,
					Since: new(At(at.Add(-time.Second))), Requests: 120, WindowMs: 30000},
				{Backend: "b", State: StateHalfOpen, Weight: 0.1, Priority: 1, EWMATTFTMs: new(float64(200.125)),
					P50TTFTMs: new(float64(180)), P95TTFTMs: new(float64(540)), SuccessRate: new(float64(1)), Rate429: new(float64(0.5)),
					Drift: DriftSuspect, CostPerMTok: new(float64(0.6))},
			},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			data, err := json.Marshal(tt.s)
			if err != nil {
				t.Fatal(err)
			}
			var got Snapshot
			if err := json.Unmarshal(data, &got); err != nil {
				t.Fatalf("Unmarshal(%s): %v", data, err)
			}
			if diff := cmp.Diff(tt.s, got); diff != "" {
				t.Errorf("round trip of %s (-want +got):\n%s", data, diff)
			}
		})
	}
}

func TestSnapshotNullsOnTheWire(t *testing.T) {
	// Fields the protocol says are null when unknown must be written as
	// null, not omitted; since is an extension and omitted when unknown.
	s := Snapshot{V: 1, Pool: "p", Backends: []Backend{{Backend: "a"}}}
	data, err := json.Marshal(s)
	if err != nil {
		t.Fatal(err)
	}
	var m struct {
		MedianEWMATTFTMs json.RawMessage              `json:"median_ewma_ttft_ms"`
		Backends         []map[string]json.RawMessage `json:"backends"`
	}
	if err := json.Unmarshal(data, &m); err != nil {
		t.Fatal(err)
	}
	if string(m.MedianEWMATTFTMs) != "null" {
		t.Errorf("median_ewma_ttft_ms = %s, want null", m.MedianEWMATTFTMs)
	}
	for _, k := range []string{"ewma_ttft_ms", "p50_ttft_ms", "p95_ttft_ms", "success_rate", "rate_429", "open_until", "cost_per_mtok"} {
		if v, ok := m.Backends[0][k]; !ok || string(v) != "null" {
			t.Errorf("backend %s = %s (present %v), want null", k, v, ok)
		}
	}
	if _, ok := m.Backends[0]["since"]; ok {
		t.Errorf("since written although unknown")
	}
}

func TestSnapshotNewerThan(t *testing.T) {
	at := time.Date(2026, 12, 2, 7, 50, 0, 0, time.UTC)
	snap := func(epoch string, seq uint64, at time.Time) *Snapshot {
		return &Snapshot{Epoch: epoch, Seq: seq, At: At(at)}
	}
	tests := []struct {
		name      string
		s, prev   *Snapshot
		wantNewer bool
	}{
		{"no previous", snap("e1", 1, at), nil, true},
		{"same epoch, next seq", snap("e1", 2, at), snap("e1", 1, at), true},
		{"same epoch, same seq", snap("e1", 1, at), snap("e1", 1, at), false},
		{"same epoch, older seq", snap("e1", 1, at.Add(time.Hour)), snap("e1", 2, at), false},
		{"same epoch, newer seq but older at", snap("e1", 3, at.Add(-time.Hour)), snap("e1", 2, at), true},
		{"other epoch, later", snap("e2", 1, at.Add(time.Second)), snap("e1", 900, at), true},
		{"other epoch, same at", snap("e2", 1, at), snap("e1", 900, at), true},
		{"other epoch, earlier", snap("e2", 5000, at.Add(-time.Second)), snap("e1", 1, at), false},
	}
	for _, tt := range tests {
		if got := tt.s.NewerThan(tt.prev); got != tt.wantNewer {
			t.Errorf("%s: NewerThan = %v, want %v", tt.name, got, tt.wantNewer)
		}
	}
}

func TestSnapshotFind(t *testing.T) {
	s := Snapshot{Backends: []Backend{{Backend: "a"}, {Backend: "b", Weight: 0.5}}}
	if b := s.Find("b"); b == nil || b.Weight != 0.5 {
		t.Errorf("Find(b) = %+v, want the backend b", b)
	}
	if b := s.Find("c"); b != nil {
		t.Errorf("Find(c) = %+v, want nil", b)
	}
	s.Find("a").Weight = 1 // Find returns the element, not a copy
	if s.Backends[0].Weight != 1 {
		t.Errorf("Find returned a copy")
	}
}

func TestTimeJSON(t *testing.T) {
	tests := []struct {
		in   string
		want time.Time
		ok   bool
	}{
		{`"2026-12-02T07:50:00.123Z"`, time.Date(2026, 12, 2, 7, 50, 0, 123e6, time.UTC), true},
		{`"2026-12-02T09:50:00+02:00"`, time.Date(2026, 12, 2, 7, 50, 0, 0, time.UTC), true},
		{`"yesterday"`, time.Time{}, false},
		{`1733125800`, time.Time{}, false},
		{`null`, time.Time{}, false},
	}
	for _, tt := range tests {
		var got Time
		err := json.Unmarshal([]byte(tt.in), &got)
		if (err == nil) != tt.ok {
			t.Errorf("Unmarshal(%s) = %v, want ok %v", tt.in, err, tt.ok)
			continue
		}
		if tt.ok && (!got.Equal(tt.want) || got.Location() != time.UTC) {
			t.Errorf("Unmarshal(%s) = %v, want %v in UTC", tt.in, got, tt.want)
		}
	}
	data, err := json.Marshal(At(time.Date(2026, 12, 2, 9, 50, 0, 123_456_789, time.FixedZone("", 7200))))
	if err != nil {
		t.Fatal(err)
	}
	if want := `"2026-12-02T07:50:00.123Z"`; string(data) != want {
		t.Errorf("Marshal = %s, want %s", data, want)
	}
}

// TestSnapshotStale: one staleness rule; a zero ttl_ms is the default
// 5 s, not stale at once.
func TestSnapshotStale(t *testing.T) {
	at := time.Date(2026, 12, 3, 10, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		ttlMs int64
		after time.Duration
		want  bool
	}{
		{5000, 4999 * time.Millisecond, false},
		{5000, 5001 * time.Millisecond, true},
		{1000, 1500 * time.Millisecond, true},
		{0, 4 * time.Second, false},
		{0, 5001 * time.Millisecond, true},
	} {
		s := &Snapshot{At: At(at), TTLMs: tc.ttlMs}
		if got := s.Stale(at.Add(tc.after)); got != tc.want {
			t.Errorf("ttl_ms %d, %v after at: stale %v, want %v", tc.ttlMs, tc.after, got, tc.want)
		}
	}
	var nilSnap *Snapshot
	if !nilSnap.Stale(at) {
		t.Error("a nil snapshot is not stale")
	}
}
