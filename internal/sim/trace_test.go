package sim

import (
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

func readInline(t *testing.T, format, data string) *Trace {
	t.Helper()
	tr, err := ReadTrace(strings.NewReader(data), "inline", format)
	if err != nil {
		t.Fatalf("ReadTrace(%s): %v", format, err)
	}
	return tr
}

func wantSkipped(t *testing.T, tr *Trace, want map[string]int) {
	t.Helper()
	if len(tr.Skipped) != len(want) {
		t.Errorf("skipped %v, want %v", tr.Skipped, want)
	}
	for r, n := range want {
		if tr.Skipped[r] != n {
			t.Errorf("skipped[%q] = %d, want %d (all: %v)", r, tr.Skipped[r], n, tr.Skipped)
		}
	}
}

// Columns are found by the header's names, in any order; rows come out by
// time; bad rows are counted by reason.
func TestReadTraceAzureCSV(t *testing.T) {
	data := "GeneratedTokens,TIMESTAMP,ContextTokens\r\n" +
		"50,2023-11-16 18:17:04.4799600,300\r\n" +
		"10,2023-11-16 18:17:03.9799600,1000\r\n" +
		"10,not a time,1000\r\n" +
		"ten,2023-11-16 18:17:05.0000000,1000\r\n" +
		"10,2023-11-16 18:17:05.0000000\r\n" +
		"7,2023-11-16 18:17:06.9799600,20"
	tr := readInline(t, "", data)
	if tr.Format != FormatAzure || len(tr.Requests) != 3 {
		t.Fatalf("format %s, %d requests, want azure-csv and 3", tr.Format, len(tr.Requests))
	}
	first, second := tr.Requests[0], tr.Requests[1]
	if first.At != 0 || first.PromptTokens != 1000 || first.OutputTokens != 10 || first.Blocks != nil {
		t.Errorf("first request %+v", first)
	}
	if second.At != 500*time.Millisecond || second.PromptTokens != 300 || second.OutputTokens != 50 {
		t.Errorf("second request %+v", second)
	}
	if tr.Span != 3*time.Second {
		t.Errorf("span %v, want 3s", tr.Span)
	}
	wantSkipped(t, tr, map[string]int{"bad timestamp": 1, "bad token count": 1, "wrong number of fields": 1})
	if _, err := ReadTrace(strings.NewReader("time,prompt\n1,2\n"), "x.csv", FormatAzure); err == nil || !strings.Contains(err.Error(), "x.csv") {
		t.Errorf("a header without token columns: err = %v, want one naming x.csv", err)
	}
}

func TestReadTraceMooncake(t *testing.T) {
	data := `{"timestamp": 3000, "input_length": 1100, "output_length": 20, "hash_ids": [0, 1, 2]}
{"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [0, 1]}
{"timestamp": 0, "input_length": 600
{"input_length": 600, "output_length": 5}
{"timestamp": 6000, "input_length": 700, "output_length": 5, "hash_ids": [0, 9]}
`
	tr := readInline(t, "", data)
	if tr.Format != FormatMooncake || len(tr.Requests) != 3 {
		t.Fatalf("format %s, %d requests", tr.Format, len(tr.Requests))
	}
	a, b, c := tr.Requests[0], tr.Requests[1], tr.Requests[2]
	if a.At != 0 || b.At != 3*time.Second || len(a.Blocks) != 2 || len(b.Blocks) != 3 {
		t.Fatalf("requests %+v %+v", a, b)
	}
	// Equal leading ids give equal prefix keys; a different block 1 after
	// the same block 0 differs from there on.
	if a.Blocks[0] != b.Blocks[0] || a.Blocks[1] != b.Blocks[1] || c.Blocks[0] != a.Blocks[0] || c.Blocks[1] == a.Blocks[1] {
		t.Errorf("prefix keys: %x %x %x", a.Blocks, b.Blocks, c.Blocks)
	}
	wantSkipped(t, tr, map[string]int{"bad json": 1, "missing or bad timestamp": 1})
}

func TestReadTraceOutcomes(t *testing.T) {
	data := `{"pool":"p","backend":"b1","ts":"2026-12-03T06:00:02.000Z","status":200,"duration_ms":1500,"ttft_ms":100,"input_tokens":800,"output_tokens":80,"prefix":"sys-a"}
{"pool":"p","backend":"b2","ts":"2026-12-03T06:00:01.000Z","status":200,"duration_ms":600,"ttft_ms":100}
{"pool":"p","ts":"2026-12-03T06:00:01.000Z","status":200}
{"pool":"p","backend":"b2","status":500}
not json
`
	tr := readInline(t, "", data)
	if tr.Format != FormatOutcomes || len(tr.Requests) != 2 {
		t.Fatalf("format %s, %d requests (skipped %v)", tr.Format, len(tr.Requests), tr.Skipped)
	}
	// Arrival is ts minus the duration: 06:00:00.400 then 06:00:00.500.
	defaulted, full := tr.Requests[0], tr.Requests[1]
	if full.At != 100*time.Millisecond || full.PromptTokens != 800 || full.OutputTokens != 80 || len(full.Blocks) != 1 {
		t.Errorf("event with tokens and prefix: %+v", full)
	}
	if defaulted.PromptTokens != tracePromptDefault || defaulted.OutputTokens != 100 || tr.Defaulted != 1 {
		t.Errorf("event without tokens: %+v (defaulted %d); want %d prompt tokens and 500 ms / 5 ms = 100 output", defaulted, tr.Defaulted, tracePromptDefault)
	}
	if tr.SkippedTotal() != 3 || tr.Skipped["no ts"] != 1 {
		t.Errorf("skipped %v, want 3 lines of which one without ts", tr.Skipped)
	}
}

func TestReadTraceNginx(t *testing.T) {
	data := `{"msec":"1764741601.500","status":"200","upstream_name":"llama","upstream_addr":"10.0.0.1:8000","upstream_status":"200","upstream_header_time":"0.150","upstream_response_time":"1.150"}
<190>Dec  3 06:00:00 web nginx: {"msec":"1764741600.900","status":"200","upstream_addr":"10.0.0.1:8000, 10.0.0.2:8000","upstream_status":"502, 200","upstream_header_time":"-, 0.100","upstream_response_time":"0.100, 0.700"}
{"msec":"1764741600.900","status":"502","upstream_name":"llama","upstream_addr":"llama","upstream_status":"-"}
garbage
`
	tr := readInline(t, FormatNginx, data)
	if len(tr.Requests) != 2 || tr.Defaulted != 2 {
		t.Fatalf("%d requests, %d defaulted (skipped %v)", len(tr.Requests), tr.Defaulted, tr.Skipped)
	}
	// The retried line arrived at 600.900 - 0.1 - 0.7 = 600.100; the other
	// at 601.500 - 1.150 = 600.350.
	if tr.Requests[1].At != 250*time.Millisecond || tr.Requests[0].OutputTokens != 120 || tr.Requests[1].OutputTokens != 200 {
		t.Errorf("requests %+v", tr.Requests)
	}
	wantSkipped(t, tr, map[string]int{"no upstream": 1, "not an nginx JSON line": 1})
	if f, err := detectFormat([]byte(`<190>Dec  3 web nginx: {"msec":"1","upstream_addr":"a"}`)); err != nil || f != FormatNginx {
		t.Errorf("detect syslog nginx: %s, %v", f, err)
	}
}

// A file with no usable request is an error naming it.
func TestReadTraceEmptyOrUnusable(t *testing.T) {
	dir := t.TempDir()
	for name, data := range map[string]string{
		"empty.jsonl":   "",
		"blank.csv":     "\n\r\n  \n",
		"header.csv":    "TIMESTAMP,ContextTokens,GeneratedTokens\n",
		"allbad.jsonl":  `{"timestamp": "x", "input_length": 1}` + "\n",
		"unknown.jsonl": `{"hello": 1}` + "\n",
	} {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
		if _, err := ReadTraceFile(path, ""); err == nil || !strings.Contains(err.Error(), path) {
			t.Errorf("%s: err = %v, want an error naming the file", name, err)
		}
	}
	if _, err := ReadTrace(strings.NewReader("a,b\n"), "f", "nope"); err == nil {
		t.Error("unknown format: no error")
	}
}

// A hit is the run of leading blocks cached; the least recently used block
// goes first at capacity, and of one prompt's blocks the tail before the
// head.
func TestBlockCache(t *testing.T) {
	c := newBlockCache(4)
	a := chainBlocks([]uint64{1, 2, 3})
	if hit := c.use(a); hit != 0 {
		t.Fatalf("cold cache hit %d blocks", hit)
	}
	if hit := c.use(a); hit != 3 {
		t.Errorf("same prompt again: %d blocks, want 3", hit)
	}
	// Same first block, other second: only the first is reused, even though
	// the third id is the same.
	b := chainBlocks([]uint64{1, 9, 3})
	if got := c.leading(b); got != 1 {
		t.Errorf("diverging prompt: %d leading blocks, want 1", got)
	}
	c.use(b) // inserts 2 blocks: 5 > 4, evicts one
	if c.size() != 4 {
		t.Errorf("size %d, want the capacity 4", c.size())
	}
	// LRU order before b: a2, a1, a0 (a0 most recent: a's blocks were
	// touched tail first). b inserted b2 (the cache full), then b1, which
	// evicted a2, then touched a0 (b0). a keeps its first two blocks: the
	// tail went, not the head.
	if got := c.leading(a); got != 2 {
		t.Errorf("after eviction a hits %d leading blocks, want 2 (its tail evicted)", got)
	}
	if _, ok := c.index[a[2]]; ok {
		t.Error("a's tail block is still cached: something else went first")
	}
	if got := c.leading(b); got != 3 {
		t.Errorf("b hits %d, want 3", got)
	}
}

// One prompt longer than the room left: its head stays and its tail goes,
// so the next request with that prompt reuses what remains. Touched head
// first (the order before 2026-12-06), the cache kept the tail, which no
// request can reach without its head: a hit of 0.
func TestBlockCacheKeepsHead(t *testing.T) {
	c := newBlockCache(4)
	c.use(chainBlocks([]uint64{7, 8, 9}))
	long := chainBlocks([]uint64{1, 2, 3, 4})
	c.use(long)
	other := chainBlocks([]uint64{5})
	c.use(other) // evicts the least recent: long's tail
	if got := c.leading(long); got != 3 {
		t.Errorf("after one eviction the long prompt hits %d leading blocks, want 3", got)
	}
	c.use(chainBlocks([]uint64{6, 10}))
	if got := c.leading(long); got != 1 {
		t.Errorf("after three evictions the long prompt hits %d leading blocks, want 1", got)
	}
}

// Every block the cache holds is reachable: its predecessor in the prompt
// is held too (leaves are evicted first), over conversations whose turns
// extend earlier ones and share a system prompt.
func TestBlockCacheEvictsLeavesFirst(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	parent := map[uint64]uint64{} // block key -> its predecessor's (0: none)
	c := newBlockCache(64)
	convs := make([][]uint64, 40) // each conversation's ids so far
	for i := range convs {
		convs[i] = []uint64{0} // the common first block
	}
	next := uint64(1)
	for range 3000 {
		k := rng.IntN(len(convs))
		for range 1 + rng.IntN(6) { // a later turn: more blocks
			convs[k] = append(convs[k], next)
			next++
		}
		if rng.IntN(8) == 0 {
			convs[k] = convs[k][:1] // a new conversation
		}
		keys := chainBlocks(convs[k])
		for i, key := range keys {
			if i > 0 {
				parent[key] = keys[i-1]
			}
		}
		c.use(keys)
		for key := range c.index {
			if p, ok := parent[key]; ok {
				if _, held := c.index[p]; !held {
					t.Fatalf("block %x is cached without its predecessor %x: unreachable", key, p)
				}
			}
		}
	}
}

func TestPrecisePrefixChoice(t *testing.T) {
	blocks := chainBlocks([]uint64{1, 2, 3, 4})
	mk := func(busy, waiting int, cached []uint64) *backend {
		be := &backend{busy: busy, waiting: waiting, kv: newBlockCache(100)}
		be.kv.use(cached)
		return be
	}
	p := newPrefixRouter(PrecisePrefix, env{ids: []string{"a", "b"}, rng: rand.New(rand.NewPCG(1, 2)),
		backends: []*backend{mk(8, 4, blocks), mk(0, 0, nil)}}).(*precisePrefix)
	req := &request{blocks: blocks, promptTokens: 2000}
	// All four blocks on the busier backend: 3 x 1 + 0 beats 0 + 2 x 1.
	if b, _ := p.pick(req, -1); b != 0 {
		t.Errorf("full hit on the loaded backend: picked %d, want 0", b)
	}
	// One block in four: 3 x 0.25 < 2, the idle backend wins.
	p.backends[0] = mk(8, 4, blocks[:1])
	if b, _ := p.pick(req, -1); b != 1 {
		t.Errorf("quarter hit on the loaded backend: picked %d, want 1", b)
	}
	// Excluding the idle one leaves the other.
	if b, _ := p.pick(req, 1); b != 0 {
		t.Errorf("exclude 1: picked %d", b)
	}
}

func TestSGLangCacheChoice(t *testing.T) {
	e := env{ids: []string{"a", "b", "c"}, rng: rand.New(rand.NewPCG(1, 2)),
		backends: []*backend{{spec: BackendSpec{KVBlocks: 100}}, {spec: BackendSpec{KVBlocks: 100}}, {spec: BackendSpec{KVBlocks: 100}}}}
	p := newPrefixRouter(SGLangCache, e).(*sglangCache)
	conv := chainBlocks([]uint64{1, 2, 3, 4})
	p.trees[1].use(conv[:3]) // b sent this conversation's first turn
	p.trees[0].use(chainBlocks([]uint64{7, 8}))
	req := &request{blocks: conv}
	// Balanced: the longest match (3 of 4 > 0.3) wins.
	if b, _ := p.pick(req, -1); b != 1 {
		t.Errorf("balanced, match on b: picked %d, want 1", b)
	}
	if p.trees[1].leading(conv) != 4 {
		t.Error("the chosen backend's tree did not get the request's blocks")
	}
	// No match above the threshold: the smallest tree (c, empty).
	if b, _ := p.pick(&request{blocks: chainBlocks([]uint64{5, 6, 7, 8})}, -1); b != 2 {
		t.Errorf("no match: picked %d, want 2 (smallest tree)", b)
	}
	// Imbalanced (b has 10 more in flight than a, and > 1.5x): least loaded.
	p.inFlight = []int{1, 11, 3}
	if b, _ := p.pick(req, -1); b != 0 {
		t.Errorf("imbalanced: picked %d, want 0 (least loaded)", b)
	}
	// Within the absolute threshold it stays on the match.
	p.inFlight = []int{1, 9, 3}
	if b, _ := p.pick(req, -1); b != 1 {
		t.Errorf("difference 8: picked %d, want 1", b)
	}
}

// sharedTraces is the path of a trace in ../shared/traces beside the
// module root (../shared/traces/README.md names each file's source, commit
// and sha256; .ci/run says where CI gets them). These replays are the only
// automated check of the real-trace path, so without the trace a test
// fails when CI is set and skips otherwise.
func sharedTraces(t *testing.T, name string) string {
	t.Helper()
	path := filepath.Join("..", "..", "..", "shared", "traces", name)
	if _, err := os.Stat(path); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("the shared trace %s is not beside the module root (../shared/traces): %v; CI must provide it (see .ci/run)", name, err)
		}
		t.Skipf("the shared trace %s is not beside the module root (../shared/traces; required when CI is set): %v", name, err)
	}
	return path
}

// A seeded replay of the Mooncake trace's first 20 minutes: exact cache
// knowledge must reuse more of the prompts than round-robin, and
// fleetwatch's affinity must too.
func TestReplayMooncakeSlice(t *testing.T) {
	tr, err := ReadTraceFile(sharedTraces(t, "mooncake_conversation.jsonl"), "")
	if err != nil {
		t.Fatal(err)
	}
	hit := map[string]float64{}
	for p, r := range replaySlice(t, tr, 20*time.Minute, TraceOptions{Speed: 2, Routers: 4, Policies: []string{RoundRobin, Fleetwatch, PrecisePrefix}}) {
		hit[p] = r.TokenHitRate
	}
	t.Logf("token hit rates %v", hit)
	if hit[PrecisePrefix] <= hit[RoundRobin] || hit[Fleetwatch] <= hit[RoundRobin] {
		t.Errorf("token hit rates %v: precise-prefix and fleetwatch should beat round-robin", hit)
	}
}

// Arbitrary bytes in any format never panic; a trace that reads has its
// requests in arrival order from 0.
func FuzzReadTrace(f *testing.F) {
	f.Add("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03.9799600,10,2\n", "")
	f.Add(`{"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [0, 1]}`, "")
	f.Add(`{"pool":"p","backend":"b","ts":"2026-12-03T06:00:02.000Z","duration_ms":1}`, FormatOutcomes)
	f.Add(`{"msec":"1764741601.500","upstream_addr":"10.0.0.1:8000","upstream_status":"200"}`, FormatNginx)
	f.Fuzz(func(t *testing.T, data, format string) {
		if !slices.Contains(TraceFormats, format) {
			format = ""
		}
		tr, err := ReadTrace(strings.NewReader(data), "fuzz", format)
		if err != nil {
			return
		}
		if len(tr.Requests) == 0 || tr.Requests[0].At != 0 {
			t.Fatalf("a trace read without error: %d requests, first at %v", len(tr.Requests), tr.Requests[0].At)
		}
		for i := 1; i < len(tr.Requests); i++ {
			if tr.Requests[i].At < tr.Requests[i-1].At {
				t.Fatalf("request %d at %v before %v", i, tr.Requests[i].At, tr.Requests[i-1].At)
			}
		}
	})
}

// TestReplayAzureSlice replays the first 15 minutes of the shared Azure
// conversation trace at 3x through 16 routers: the file reads whole (19,366
// requests, no line skipped, as its README says), every request of the
// slice is served, and a policy that sees load (least-conn's own counts,
// fleetwatch's published load) has a lower p99 TTFT than round-robin,
// which ignores it.
func TestReplayAzureSlice(t *testing.T) {
	tr, err := ReadTraceFile(sharedTraces(t, "azure2023_conv.csv"), "")
	if err != nil {
		t.Fatal(err)
	}
	if tr.Format != FormatAzure || len(tr.Requests) != 19366 || tr.SkippedTotal() != 0 {
		t.Fatalf("read %s as %s: %d requests, skipped %s; want azure-csv, 19366, none", tr.Name, tr.Format, len(tr.Requests), tr.SkippedSummary())
	}
	p99 := map[string]float64{}
	for p, r := range replaySlice(t, tr, 15*time.Minute, TraceOptions{Speed: 3, Routers: 16, Policies: []string{RoundRobin, LeastConn, Fleetwatch}}) {
		p99[p] = r.TTFTP99
	}
	t.Logf("p99 TTFT %v", p99)
	if p99[LeastConn] >= p99[RoundRobin] || p99[Fleetwatch] >= p99[RoundRobin] {
		t.Errorf("p99 TTFT %v: least-conn and fleetwatch should beat round-robin", p99)
	}
}

// replaySlice replays tr's requests that arrive before until through o's
// policies with seed 1, checking that every one of them is served, and
// returns each policy's result.
func replaySlice(t *testing.T, tr *Trace, until time.Duration, o TraceOptions) map[string]*Result {
	t.Helper()
	n := 0
	for n < len(tr.Requests) && tr.Requests[n].At < until {
		n++
	}
	tr.Requests = tr.Requests[:n]
	tr.Span = tr.Requests[n-1].At
	sc := TraceScenario(tr, o)
	out := map[string]*Result{}
	for _, p := range sc.Policies {
		r, err := Run(sc, p, 1)
		if err != nil {
			t.Fatal(err)
		}
		if r.Requests != n {
			t.Errorf("%s: %d requests, want the slice's %d", p, r.Requests, n)
		}
		out[p] = r
	}
	return out
}

// A fleet spec reads as groups; a bad group is an error that names it.
func TestParseFleet(t *testing.T) {
	got, err := ParseFleet("2x8, 1x16@1.5:1600,1x4@2:0")
	want := []FleetGroup{{Count: 2, Slots: 8, Times: 1}, {Count: 1, Slots: 16, Times: 1.5, KVBlocks: 1600}, {Count: 1, Slots: 4, Times: 2, KVBlocks: -1}}
	if err != nil || !slices.Equal(got, want) {
		t.Fatalf("ParseFleet = %v, %v; want %v", got, err, want)
	}
	for _, bad := range []struct{ spec, names string }{
		{"", `group 1 ""`},
		{"2x8,2y8", `group 2 "2y8"`},
		{"0x8", "count"},
		{"2x0", "slots"},
		{"2x8@0", "times"},
		{"2x8@NaN", "times"},
		{"2x8@-1", "times"},
		{"2x8:-5", "KV blocks"},
		{"2x8,", `group 2 ""`},
		{"5000x8", "more than 4096 backends"},
	} {
		if _, err := ParseFleet(bad.spec); err == nil || !strings.Contains(err.Error(), bad.names) {
			t.Errorf("ParseFleet(%q) = %v; want an error naming %s", bad.spec, err, bad.names)
		}
	}
}

// A replay through a fleet of unequal backends: the backend that takes
// four times as long gets a smaller share of the attempts than its fast
// peer under every policy that sees load, and none under round-robin.
func TestReplayUnequalFleet(t *testing.T) {
	var b strings.Builder
	b.WriteString("TIMESTAMP,ContextTokens,GeneratedTokens\n")
	start := time.Date(2023, 11, 16, 18, 0, 0, 0, time.UTC)
	for i := range 1200 { // 4 requests a second for 5 minutes
		fmt.Fprintf(&b, "%s,%d,%d\n", start.Add(time.Duration(i)*250*time.Millisecond).Format("2006-01-02 15:04:05.0000000"), 1000+i%7*300, 60+i%5*20)
	}
	tr, err := ReadTrace(strings.NewReader(b.String()), "unequal.csv", "")
	if err != nil {
		t.Fatal(err)
	}
	o := TraceOptions{Routers: 2, Fleet: []FleetGroup{{Count: 1, Slots: 8}, {Count: 1, Slots: 8, Times: 4}},
		Policies: []string{RoundRobin, LeastConn, Fleetwatch}}
	sc := TraceScenario(tr, o)
	if !strings.Contains(sc.Description, "2 backends (1 of 8 slots with 800 KV blocks; 1 of 8 slots at 4x the time with 800 KV blocks)") {
		t.Errorf("description %q does not say the fleet", sc.Description)
	}
	for _, p := range sc.Policies {
		r, err := Run(sc, p, 1)
		if err != nil {
			t.Fatal(err)
		}
		var share [2]float64
		for _, sec := range r.Shares {
			for i, v := range sec {
				share[i] += v
			}
		}
		t.Logf("%s: summed shares fast %.0f, slow %.0f; p99 %.0f ms", p, share[0], share[1], r.TTFTP99)
		if r.Failed > 0 {
			t.Errorf("%s: %d requests failed at a load both backends carry", p, r.Failed)
		}
		switch slow := share[1] / (share[0] + share[1]); {
		case p == RoundRobin && math.Abs(slow-0.5) > 0.02:
			t.Errorf("round-robin: slow backend's share %.3f, want 0.5", slow)
		case p != RoundRobin && slow >= 0.45:
			t.Errorf("%s: slow backend's share %.3f, want clearly under half", p, slow)
		}
	}
}
