package fleetwatch

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"pgregory.net/rapid"
)

// validSnapshot returns a snapshot that uses every field: one backend in
// each state, with every nullable number set on some and null on others.
func validSnapshot() *Snapshot {
	at := time.Date(2026, 12, 2, 7, 50, 1, 250e6, time.UTC)
	return &Snapshot{
		V: 1, Pool: "meta-llama/Llama-3.1-70B-Instruct", Epoch: "01JB4X", Seq: 7, At: At(at), TTLMs: 5000,
		Mode: ModeBalance, AllOpen: AllOpenShed, MedianEWMATTFTMs: new(float64(210)), AffinityTolerance: DefaultAffinityTolerance,
		Backends: []Backend{
			{Backend: "http://vllm-a:8000", State: StateOpen, OpenUntil: new(At(at.Add(30 * time.Second))),
				Reason: "error rate 0.42 >= 0.25 over 120 requests in 30s", Drift: DriftUnknown,
				Since: new(At(at.Add(-time.Second))), Requests: 120, WindowMs: 30000},
			{Backend: "vllm-b", State: StateHalfOpen, Weight: 0.1, Priority: 1, EWMATTFTMs: new(float64(200.125)),
				P50TTFTMs: new(float64(180)), P95TTFTMs: new(float64(540)), SuccessRate: new(float64(1)), Rate429: new(float64(0.5)),
				Requests: 3, WindowMs: 30000, Drift: DriftSuspect, CostPerMTok: new(float64(0.6)),
				P50TPOTMs: new(float64(18.5)), P95TPOTMs: new(float64(31))},
			{Backend: "vllm-c", State: StateClosed, Weight: 1, Priority: -1, EWMATTFTMs: new(float64(0)),
				P50TTFTMs: new(float64(0)), P95TTFTMs: new(float64(0)), SuccessRate: new(float64(0)), Rate429: new(float64(1)),
				Requests: 0, WindowMs: 0, Drift: DriftDrifted, CostPerMTok: new(float64(0)),
				P50TPOTMs: new(float64(0)), P95TPOTMs: new(float64(0))},
			{Backend: "vllm-d", State: StateClosed, Weight: 0, Drift: DriftOK},
		},
	}
}

func TestSnapshotValidateAccepts(t *testing.T) {
	decode := func(s string) *Snapshot {
		t.Helper()
		var snap Snapshot
		if err := json.Unmarshal([]byte(s), &snap); err != nil {
			t.Fatal(err)
		}
		return &snap
	}
	const minimal = `{"v":1,"pool":"p","epoch":"e","seq":0,"at":"2026-12-02T07:50:01.000Z","ttl_ms":0,` +
		`"mode":"failover","all_open":"spread","median_ewma_ttft_ms":null,"affinity_tolerance":0,"backends":%s}`
	tests := []struct {
		name string
		snap *Snapshot
	}{
		{"the protocol example", decode(protocolSnapshot)},
		{"every field used", validSnapshot()},
		{"no backends", decode(strings.Replace(minimal, "%s", "[]", 1))},
		{"null backends", decode(strings.Replace(minimal, "%s", "null", 1))},
		{"unknown fields", decode(strings.Replace(minimal, "%s",
			`[{"backend":"a","state":"closed","weight":1,"drift":"ok","x":{"y":[1]}}],"future":true`, 1))},
		{"null numbers and open_until", decode(strings.Replace(minimal, "%s",
			`[{"backend":"a","state":"open","weight":0,"priority":0,"ewma_ttft_ms":null,"p50_ttft_ms":null,`+
				`"p95_ttft_ms":540,"success_rate":null,"rate_429":null,"requests":0,"window_ms":30000,`+
				`"open_until":null,"reason":"","drift":"unknown","cost_per_mtok":null}]`, 1))},
		{"time per output token with one quantile", decode(strings.Replace(minimal, "%s",
			`[{"backend":"a","state":"closed","weight":1,"drift":"ok","p95_tpot_ms":12.5}]`, 1))},
		{"times with an offset and microseconds", decode(strings.Replace(
			strings.Replace(minimal, "2026-12-02T07:50:01.000Z", "2026-12-02T09:50:01.123456+02:00", 1), "%s",
			`[{"backend":"a","state":"open","weight":0,"drift":"ok","open_until":"0000-01-01T00:00:00Z"}]`, 1))},
		{"backend ids sort bytewise", decode(strings.Replace(minimal, "%s",
			`[{"backend":"B","state":"closed","weight":1,"drift":"ok"},{"backend":"a","state":"closed","weight":1,"drift":"ok"},`+
				`{"backend":"é","state":"closed","weight":1,"drift":"ok"}]`, 1))},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if err := tt.snap.Validate(); err != nil {
				t.Errorf("Validate() = %v, want nil", err)
			}
		})
	}
}

func TestSnapshotValidateRejects(t *testing.T) {
	far := new(At(time.Date(9999, 12, 31, 23, 0, 0, 0, time.UTC)))
	far.Time = far.Add(2 * time.Hour) // year 10000
	tests := []struct {
		name   string
		mutate func(s *Snapshot)
		want   error // the kind, besides ErrInvalidSnapshot
	}{
		{"v 0 (absent)", func(s *Snapshot) { s.V = 0 }, ErrBadVersion},
		{"v 2", func(s *Snapshot) { s.V = 2 }, ErrBadVersion},
		{"no pool", func(s *Snapshot) { s.Pool = "" }, ErrInvalidPool},
		{"pool with ..", func(s *Snapshot) { s.Pool = "a..b" }, ErrInvalidPool},
		{"pool with a space", func(s *Snapshot) { s.Pool = "a b" }, ErrInvalidPool},
		{"no epoch", func(s *Snapshot) { s.Epoch = "" }, ErrMissingField},
		{"no at", func(s *Snapshot) { s.At = Time{} }, ErrMissingField},
		{"at after 9999", func(s *Snapshot) { s.At = *far }, ErrOutOfRange},
		{"negative ttl_ms", func(s *Snapshot) { s.TTLMs = -1 }, ErrOutOfRange},
		{"no mode", func(s *Snapshot) { s.Mode = "" }, ErrBadValue},
		{"unknown mode", func(s *Snapshot) { s.Mode = "random" }, ErrBadValue},
		{"unknown all_open", func(s *Snapshot) { s.AllOpen = "panic" }, ErrBadValue},
		{"unknown shadow", func(s *Snapshot) { s.Shadow = "advisory" }, ErrBadValue},
		{"negative median", func(s *Snapshot) { s.MedianEWMATTFTMs = new(float64(-1)) }, ErrOutOfRange},
		{"NaN median", func(s *Snapshot) { s.MedianEWMATTFTMs = new(float64(math.NaN())) }, ErrOutOfRange},
		{"infinite affinity_tolerance", func(s *Snapshot) { s.AffinityTolerance = math.Inf(1) }, ErrOutOfRange},
		{"negative affinity_tolerance", func(s *Snapshot) { s.AffinityTolerance = -2.5 }, ErrOutOfRange},
		{"backends not sorted", func(s *Snapshot) { s.Backends[1], s.Backends[2] = s.Backends[2], s.Backends[1] }, ErrBadValue},
		{"duplicate backend", func(s *Snapshot) { s.Backends[2].Backend = s.Backends[1].Backend }, ErrBadValue},
		{"empty backend id", func(s *Snapshot) { s.Backends[0].Backend = "" }, ErrInvalidBackend},
		{"empty backend id after others", func(s *Snapshot) { s.Backends[3].Backend = "" }, ErrInvalidBackend},
		{"control character in backend id", func(s *Snapshot) { s.Backends[3].Backend = "vllm-d\n" }, ErrInvalidBackend},
		{"backend id too long", func(s *Snapshot) { s.Backends[3].Backend = "vllm-d" + strings.Repeat("x", 251) }, ErrInvalidBackend},
		{"no state", func(s *Snapshot) { s.Backends[1].State = "" }, ErrBadValue},
		{"unknown state", func(s *Snapshot) { s.Backends[1].State = "broken" }, ErrBadValue},
		{"weight above 1", func(s *Snapshot) { s.Backends[2].Weight = 1.5 }, ErrOutOfRange},
		{"negative weight", func(s *Snapshot) { s.Backends[2].Weight = -0.1 }, ErrOutOfRange},
		{"NaN weight", func(s *Snapshot) { s.Backends[2].Weight = math.NaN() }, ErrOutOfRange},
		{"infinite ewma", func(s *Snapshot) { s.Backends[1].EWMATTFTMs = new(float64(math.Inf(1))) }, ErrOutOfRange},
		{"negative p50", func(s *Snapshot) { s.Backends[1].P50TTFTMs = new(float64(-1)) }, ErrOutOfRange},
		{"NaN p95", func(s *Snapshot) { s.Backends[1].P95TTFTMs = new(float64(math.NaN())) }, ErrOutOfRange},
		{"success_rate above 1", func(s *Snapshot) { s.Backends[1].SuccessRate = new(float64(1.01)) }, ErrOutOfRange},
		{"negative rate_429", func(s *Snapshot) { s.Backends[1].Rate429 = new(float64(-0.5)) }, ErrOutOfRange},
		{"negative cost", func(s *Snapshot) { s.Backends[1].CostPerMTok = new(float64(-1)) }, ErrOutOfRange},
		{"negative requests", func(s *Snapshot) { s.Backends[1].Requests = -1 }, ErrOutOfRange},
		{"negative window_ms", func(s *Snapshot) { s.Backends[1].WindowMs = -30000 }, ErrOutOfRange},
		{"open_until on a closed backend", func(s *Snapshot) { s.Backends[2].OpenUntil = new(At(s.At.Time)) }, ErrBadValue},
		{"open_until on a half-open backend", func(s *Snapshot) { s.Backends[1].OpenUntil = new(At(s.At.Time)) }, ErrBadValue},
		{"open_until after 9999", func(s *Snapshot) { s.Backends[0].OpenUntil = far }, ErrOutOfRange},
		{"no drift", func(s *Snapshot) { s.Backends[3].Drift = "" }, ErrBadValue},
		{"unknown drift", func(s *Snapshot) { s.Backends[3].Drift = "fine" }, ErrBadValue},
		{"since after 9999", func(s *Snapshot) { s.Backends[0].Since = far }, ErrOutOfRange},
		{"negative routers", func(s *Snapshot) { s.Routers = -1 }, ErrOutOfRange},
		{"negative load.running", func(s *Snapshot) { s.Backends[1].Load = &Load{Running: -1} }, ErrOutOfRange},
		{"NaN load.waiting", func(s *Snapshot) { s.Backends[1].Load = &Load{Waiting: math.NaN()} }, ErrOutOfRange},
		{"load.kv_cache_usage above 1", func(s *Snapshot) { s.Backends[1].Load = &Load{KVCacheUsage: new(float64(1.2))} }, ErrOutOfRange},
		{"negative load.age_ms", func(s *Snapshot) { s.Backends[1].Load = &Load{AgeMs: -5} }, ErrOutOfRange},
		{"negative p50_tpot_ms", func(s *Snapshot) { s.Backends[1].P50TPOTMs = new(float64(-1)) }, ErrOutOfRange},
		{"NaN p95_tpot_ms", func(s *Snapshot) { s.Backends[1].P95TPOTMs = new(float64(math.NaN())) }, ErrOutOfRange},
		{"infinite p50_tpot_ms", func(s *Snapshot) { s.Backends[2].P50TPOTMs = new(float64(math.Inf(1))) }, ErrOutOfRange},
		{"p50_tpot_ms above p95_tpot_ms", func(s *Snapshot) {
			s.Backends[1].P50TPOTMs, s.Backends[1].P95TPOTMs = new(float64(40)), new(float64(30))
		}, ErrBadValue},
	}
	kinds := []error{ErrBadVersion, ErrInvalidPool, ErrInvalidBackend, ErrMissingField, ErrOutOfRange, ErrBadValue}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := validSnapshot()
			tt.mutate(s)
			err := s.Validate()
			if !errors.Is(err, ErrInvalidSnapshot) || !errors.Is(err, tt.want) {
				t.Fatalf("Validate() = %v, want ErrInvalidSnapshot and %v", err, tt.want)
			}
			for _, k := range kinds {
				if k != tt.want && errors.Is(err, k) {
					t.Errorf("Validate() = %v also wraps %v", err, k)
				}
			}
		})
	}
	if err := (*Snapshot)(nil).Validate(); !errors.Is(err, ErrInvalidSnapshot) {
		t.Errorf("nil.Validate() = %v, want ErrInvalidSnapshot", err)
	}
}

// TestSnapshotValidateGenerated checks, for generated valid snapshots, that
// Validate accepts them and that what the project encodes decodes to the
// same snapshot, which still validates.
func TestSnapshotValidateGenerated(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		s := genSnapshot(t)
		if err := s.Validate(); err != nil {
			t.Fatalf("Validate() = %v for a generated valid snapshot", err)
		}
		checkSnapshotRoundTrip(t, s)
	})
}

// FuzzSnapshotValidate decodes arbitrary bytes as a snapshot: Validate must
// never panic, must return an error wrapping ErrInvalidSnapshot and exactly
// one kind, or nil; a snapshot it accepts holds the protocol's invariants,
// and encoding it gives JSON that decodes to the same snapshot (times at
// the protocol's millisecond precision), which validates again.
func FuzzSnapshotValidate(f *testing.F) {
	valid, err := json.Marshal(validSnapshot())
	if err != nil {
		f.Fatal(err)
	}
	for _, s := range []string{
		protocolSnapshot, string(valid), `{}`, `[]`, `null`, `{"v":1}`,
		strings.Replace(protocolSnapshot, `"weight": 1.0`, `"weight": 1.5`, 1),
		strings.Replace(protocolSnapshot, `"open_until": null`, `"open_until": "2026-12-02T07:50:31.000Z"`, 1),
		strings.Replace(protocolSnapshot, `"at": "2026-12-02T07:50:01.000Z"`, `"at": "0000-01-01T00:30:00.123456+01:00"`, 1),
		strings.Replace(protocolSnapshot, `"at": "2026-12-02T07:50:01.000Z"`, `"at": "9999-12-31T23:59:59.999999999Z"`, 1),
		strings.Replace(protocolSnapshot, `"backends": [`, `"backends": [{"backend":"vllm-a","state":"closed","weight":1,"drift":"ok"},`, 1),
		strings.Replace(protocolSnapshot, `"reason": ""`, `"reason": "\ud800 \u2028 <&> \xff"`, 1),
	} {
		f.Add([]byte(s))
	}
	kinds := []error{ErrBadVersion, ErrInvalidPool, ErrInvalidBackend, ErrMissingField, ErrOutOfRange, ErrBadValue}
	f.Fuzz(func(t *testing.T, data []byte) {
		var s Snapshot
		if json.Unmarshal(data, &s) != nil {
			return
		}
		if err := s.Validate(); err != nil {
			n := 0
			for _, k := range kinds {
				if errors.Is(err, k) {
					n++
				}
			}
			if !errors.Is(err, ErrInvalidSnapshot) || n != 1 {
				t.Fatalf("Validate() = %v: want ErrInvalidSnapshot and one kind", err)
			}
			return
		}
		checkValidInvariants(t, &s)
		checkSnapshotRoundTrip(t, &s)
	})
}

// fatalfer is the part of *testing.T and *rapid.T the checks use.
type fatalfer interface {
	Helper()
	Fatalf(format string, args ...any)
}

// checkValidInvariants restates, independently of Validate, what a valid
// snapshot guarantees to a router.
func checkValidInvariants(t fatalfer, s *Snapshot) {
	t.Helper()
	if s.V != 1 || ValidatePoolID(s.Pool) != nil || s.Epoch == "" || s.At.IsZero() || s.TTLMs < 0 {
		t.Fatalf("accepted a snapshot with a bad header: %+v", s)
	}
	for i, b := range s.Backends {
		if i > 0 && !(s.Backends[i-1].Backend < b.Backend) {
			t.Fatalf("accepted unsorted or duplicate backends %q, %q", s.Backends[i-1].Backend, b.Backend)
		}
		if !(b.Weight >= 0 && b.Weight <= 1) {
			t.Fatalf("accepted weight %v", b.Weight)
		}
		if b.OpenUntil != nil && b.State != StateOpen {
			t.Fatalf("accepted open_until on a %s backend", b.State)
		}
	}
}

// checkSnapshotRoundTrip encodes s the project's way (json.Marshal, as
// feed.Publisher does), decodes it, and wants s back, valid.
func checkSnapshotRoundTrip(t fatalfer, s *Snapshot) {
	t.Helper()
	enc, err := json.Marshal(s)
	if err != nil {
		t.Fatalf("Marshal(valid snapshot) = %v", err)
	}
	var back Snapshot
	if err := json.Unmarshal(enc, &back); err != nil {
		t.Fatalf("Unmarshal(Marshal(s)) = %v; encoded %s", err, enc)
	}
	if err := back.Validate(); err != nil {
		t.Fatalf("Validate(decode(encode(s))) = %v; encoded %s", err, enc)
	}
	if diff := cmp.Diff(atWirePrecision(s), &back); diff != "" {
		t.Fatalf("decode(encode(s)) (-want +got):\n%s", diff)
	}
}

// atWirePrecision returns a copy of s with its times as the wire carries
// them: UTC, truncated to the millisecond.
func atWirePrecision(s *Snapshot) *Snapshot {
	c := *s
	c.At = At(s.At.Time)
	trunc := func(p *Time) *Time {
		if p == nil {
			return nil
		}
		return new(At(p.Time))
	}
	if s.Backends != nil {
		c.Backends = make([]Backend, len(s.Backends))
		for i, b := range s.Backends {
			b.OpenUntil, b.Since = trunc(b.OpenUntil), trunc(b.Since)
			c.Backends[i] = b
		}
	}
	return &c
}

// genSnapshot draws a valid snapshot covering the protocol's ranges.
func genSnapshot(t *rapid.T) *Snapshot {
	genTime := func(label string) Time {
		ms := rapid.Int64Range(-62167219200000, 253402300799999).Draw(t, label) // years 0000 to 9999
		return At(time.UnixMilli(ms))
	}
	genNullable := func(label string, hi float64) *float64 {
		if rapid.Bool().Draw(t, label+" null") {
			return nil
		}
		return new(float64(rapid.Float64Range(0, hi).Draw(t, label)))
	}
	ids := rapid.SliceOfDistinct(rapid.StringMatching(`[ -~é€😀]{1,20}`), func(s string) string { return s }).Draw(t, "backends")
	slices.Sort(ids)
	s := &Snapshot{
		V: ProtocolVersion, Pool: rapid.StringMatching(`[a-zA-Z0-9][-/_=a-zA-Z0-9]{0,30}`).Draw(t, "pool"),
		Epoch: rapid.StringMatching(`.{1,30}`).Draw(t, "epoch"), Seq: rapid.Uint64().Draw(t, "seq"),
		At: genTime("at"), TTLMs: rapid.Int64Min(0).Draw(t, "ttl_ms"),
		Mode:              rapid.SampledFrom([]Mode{ModeBalance, ModeFailover}).Draw(t, "mode"),
		AllOpen:           rapid.SampledFrom([]AllOpen{AllOpenShed, AllOpenSpread}).Draw(t, "all_open"),
		MedianEWMATTFTMs:  genNullable("median", MaxDurationMs),
		AffinityTolerance: rapid.Float64Range(0, 100).Draw(t, "affinity_tolerance"),
		Routers:           rapid.IntRange(0, 1000).Draw(t, "routers"),
		Shadow:            rapid.SampledFrom([]Shadow{ShadowOff, ShadowBreakers, ShadowObserve}).Draw(t, "shadow"),
		Backends:          make([]Backend, len(ids)),
	}
	for i, id := range ids {
		b := Backend{
			Backend: id, State: rapid.SampledFrom([]State{StateClosed, StateOpen, StateHalfOpen}).Draw(t, "state"),
			Weight: rapid.Float64Range(0, 1).Draw(t, "weight"), Priority: rapid.Int().Draw(t, "priority"),
			EWMATTFTMs: genNullable("ewma", MaxDurationMs), P50TTFTMs: genNullable("p50", MaxDurationMs),
			P95TTFTMs: genNullable("p95", MaxDurationMs), SuccessRate: genNullable("success_rate", 1),
			Rate429: genNullable("rate_429", 1), CostPerMTok: genNullable("cost", 1000),
			Requests: rapid.Int64Min(0).Draw(t, "requests"), WindowMs: rapid.Int64Min(0).Draw(t, "window_ms"),
			Reason: rapid.String().Draw(t, "reason"),
			Drift:  rapid.SampledFrom([]DriftStatus{DriftUnknown, DriftOK, DriftSuspect, DriftDrifted}).Draw(t, "drift"),
		}
		if b.State == StateOpen && rapid.Bool().Draw(t, "open_until set") {
			v := genTime("open_until")
			b.OpenUntil = &v
		}
		if rapid.Bool().Draw(t, "since set") {
			v := genTime("since")
			b.Since = &v
		}
		if rapid.Bool().Draw(t, "load set") {
			b.Load = &Load{
				Running: rapid.Float64Range(0, 1e6).Draw(t, "running"), Waiting: rapid.Float64Range(0, 1e6).Draw(t, "waiting"),
				KVCacheUsage: genNullable("kv_cache_usage", 1), AgeMs: rapid.Int64Min(0).Draw(t, "age_ms"),
				Source: rapid.SampledFrom([]string{"event", "metrics"}).Draw(t, "source"),
			}
		}
		s.Backends[i] = b
	}
	return s
}

// BenchmarkSnapshotValidate measures the check a watcher makes on every
// snapshot it receives, for a pool of 32 backends.
func BenchmarkSnapshotValidate(b *testing.B) {
	s := validSnapshot()
	tmpl := s.Backends[1]
	s.Backends = s.Backends[:0]
	for i := range 32 {
		bk := tmpl
		bk.Backend = fmt.Sprintf("vllm-%02d", i)
		s.Backends = append(s.Backends, bk)
	}
	if err := s.Validate(); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if err := s.Validate(); err != nil {
			b.Fatal(err)
		}
	}
}
