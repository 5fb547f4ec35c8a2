package epp

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fleetwatch/fleetwatch"
	"github.com/fleetwatch/fleetwatch/feed/route"
)

type testClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *testClock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.now }
func (c *testClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

// pickFixture is a pick endpoint over one pool of four backends, on a real
// socket, with a decision applied: b3 open.
type pickFixture struct {
	clock *testClock
	pools *route.Pools
	h     *PickHandler
	url   string
}

func newPickFixture(t *testing.T, why bool) *pickFixture {
	t.Helper()
	clock := &testClock{now: time.Date(2026, 12, 6, 12, 0, 0, 0, time.UTC)}
	var bs []route.Backend
	for i, addr := range []string{"10.0.0.1:8000", "10.0.0.2:8000", "10.0.0.3:8000", "10.0.0.4:8000"} {
		bs = append(bs, route.Backend{ID: "b" + string(rune('0'+i)), URL: "http://" + addr})
	}
	pools, err := route.NewPools([]route.Pool{{ID: "chat", Models: []string{"llama"}, Backends: bs}}, clock.Now, nil)
	if err != nil {
		t.Fatal(err)
	}
	until := fleetwatch.At(clock.now.Add(time.Minute))
	snap := &fleetwatch.Snapshot{V: 1, Pool: "chat", Epoch: "e", Seq: 1, At: fleetwatch.At(clock.now), TTLMs: 5000,
		Mode: fleetwatch.ModeBalance, AllOpen: fleetwatch.AllOpenShed}
	for _, b := range bs {
		d := fleetwatch.Backend{Backend: b.ID, State: fleetwatch.StateClosed, Weight: 1}
		if b.ID == "b3" {
			d.State, d.Weight, d.OpenUntil = fleetwatch.StateOpen, 0, &until
		}
		snap.Backends = append(snap.Backends, d)
	}
	pools.Apply(snap)
	h, err := NewPickHandler(PickSettings{Pools: pools, Why: why, Now: clock.Now, Seed: 1, Hold: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return &pickFixture{clock: clock, pools: pools, h: h, url: srv.URL}
}

func (f *pickFixture) get(t *testing.T, path string, header ...string) *http.Response {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, f.url+path, nil)
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp
}

// A pick names an upstream that is not open, by its address, and counts in
// flight until the proxy's outcome event for that backend finishes it; the
// load spreads over the three closed backends.
func TestPickNamesAnUpstream(t *testing.T) {
	f := newPickFixture(t, false)
	seen := map[string]int{}
	for range 30 {
		resp := f.get(t, "/v1/pick?pool=chat")
		if resp.StatusCode != 200 {
			t.Fatalf("status %d", resp.StatusCode)
		}
		up, id := resp.Header.Get(HeaderUpstream), resp.Header.Get(HeaderBackend)
		if id == "b3" || f.pools.Address("chat", id) != up {
			t.Fatalf("picked %s at %s: want a closed backend and its address", id, up)
		}
		seen[id]++
	}
	if len(seen) != 3 || seen["b0"] != 10 {
		t.Errorf("picks %v: want the three closed backends, 10 each (in flight spreads them)", seen)
	}
	picker := f.pools.Picker("chat")
	ev := fleetwatch.Event{Pool: "chat", Backend: "b0", Outcome: fleetwatch.OutcomeOK, TTFTMs: 80, HasTTFT: true}
	for range 4 {
		f.h.Outcome(&ev)
	}
	if n := picker.InFlight("b0"); n != 6 {
		t.Errorf("b0 in flight %d after 4 of its 10 outcomes, want 6", n)
	}
	f.clock.Advance(2 * time.Minute)
	f.h.Sweep(f.clock.Now())
	for _, id := range []string{"b0", "b1", "b2"} {
		if n := picker.InFlight(id); n != 0 {
			t.Errorf("%s in flight %d after the hold, want 0", id, n)
		}
	}
	if picker.UnbalancedDone() != 0 {
		t.Errorf("unbalanced Done %d", picker.UnbalancedDone())
	}
}

// The pool comes from the query, the pool header, the model header or the
// only pool; an unknown one is 404.
func TestPickFindsThePool(t *testing.T) {
	f := newPickFixture(t, false)
	for _, c := range []struct {
		path   string
		header []string
		want   int
	}{
		{"/v1/pick", nil, 200},
		{"/v1/pick?pool=chat", nil, 200},
		{"/v1/pick", []string{HeaderPool, "chat"}, 200},
		{"/v1/pick", []string{HeaderModel, "llama"}, 200},
		{"/v1/pick?pool=nope", nil, 404},
		{"/v1/pick", []string{HeaderPool, "nope"}, 404},
		{"/v1/pick", []string{HeaderModel, "gpt-9"}, 200}, // one pool takes every model, as the router does
	} {
		if got := f.get(t, c.path, c.header...).StatusCode; got != c.want {
			t.Errorf("%s %v: %d, want %d", c.path, c.header, got, c.want)
		}
	}
}

// A subset restricts the pick; a subset with no eligible backend is shed
// with 503, or the status the proxy asks for (403 for nginx), with the
// reason and a Retry-After.
func TestPickSubsetAndShed(t *testing.T) {
	f := newPickFixture(t, false)
	for range 10 {
		resp := f.get(t, "/v1/pick", HeaderAmong, "10.0.0.2:8000, b3")
		if resp.StatusCode != 200 || resp.Header.Get(HeaderBackend) != "b1" {
			t.Fatalf("subset of b1 and open b3: %d %s, want b1", resp.StatusCode, resp.Header.Get(HeaderBackend))
		}
	}
	resp := f.get(t, "/v1/pick", HeaderAmong, "10.0.0.4:8000")
	if resp.StatusCode != 503 || resp.Header.Get(HeaderShed) != "all_open" || resp.Header.Get("Retry-After") == "" {
		t.Errorf("subset of open b3: %d shed %q retry-after %q; want 503 all_open with a Retry-After",
			resp.StatusCode, resp.Header.Get(HeaderShed), resp.Header.Get("Retry-After"))
	}
	resp = f.get(t, "/v1/pick", HeaderAmong, "10.9.9.9:1", HeaderShedStatus, "403")
	if resp.StatusCode != 403 || resp.Header.Get(HeaderShed) != "no_eligible_endpoint" {
		t.Errorf("subset of nothing known, for nginx: %d shed %q; want 403 no_eligible_endpoint", resp.StatusCode, resp.Header.Get(HeaderShed))
	}
}

// With Why, the answer says why the backend stands where it does; a
// prefix keeps requests on one backend (each finished before the next: the
// bounded-load rule moves a prefix off a backend that holds more than its
// share in flight).
func TestPickWhyAndAffinity(t *testing.T) {
	f := newPickFixture(t, true)
	first := ""
	for range 5 {
		resp := f.get(t, "/v1/pick", HeaderPrefix, "you are a pirate")
		if first == "" {
			first = resp.Header.Get(HeaderBackend)
		}
		if got := resp.Header.Get(HeaderBackend); got != first {
			t.Fatalf("a prefix went to %s, then %s", first, got)
		}
		f.h.Outcome(&fleetwatch.Event{Pool: "chat", Backend: first, Outcome: fleetwatch.OutcomeOK})
		if resp.Header.Get(route.HeaderState) != "closed" || resp.Header.Get(route.HeaderWeight) != "1" ||
			resp.Header.Get(route.HeaderReasonClass) != route.WhyHealthy || resp.Header.Get(route.HeaderDecisionAge) != "0" {
			t.Errorf("why headers %v", resp.Header)
		}
	}
	resp := f.get(t, "/v1/pick")
	if !strings.HasPrefix(resp.Header.Get(HeaderUpstream), "10.0.0.") {
		t.Errorf("upstream %q", resp.Header.Get(HeaderUpstream))
	}
}

// A retry's pick (X-Fleetwatch-Tried) avoids what the request tried: the
// last one tried unless it is the only candidate left, the earlier ones
// always; it draws from the retry budget, and once the budget is spent a
// retry is shed with the reason retry_budget.
func TestPickRetryAvoidsTried(t *testing.T) {
	f := newPickFixture(t, false)
	for range 5 {
		for range 15 { // first attempts: 3 retries' worth of budget
			f.get(t, "/v1/pick")
		}
		resp := f.get(t, "/v1/pick", HeaderTried, "10.0.0.1:8000")
		if resp.StatusCode != 200 || resp.Header.Get(HeaderBackend) == "b0" {
			t.Fatalf("retry after b0: %d %s, want another closed backend", resp.StatusCode, resp.Header.Get(HeaderBackend))
		}
		resp = f.get(t, "/v1/pick", HeaderTried, "b0, 10.0.0.2:8000")
		if resp.StatusCode != 200 || resp.Header.Get(HeaderBackend) != "b2" {
			t.Fatalf("retry after b0 and b1: %d %s, want b2 (b3 is open)", resp.StatusCode, resp.Header.Get(HeaderBackend))
		}
		resp = f.get(t, "/v1/pick", HeaderTried, "b2", HeaderAmong, "b2,b3")
		if resp.StatusCode != 200 || resp.Header.Get(HeaderBackend) != "b2" {
			t.Fatalf("retry after b2, the only closed candidate: %d %s, want b2 again", resp.StatusCode, resp.Header.Get(HeaderBackend))
		}
	}
	// The clock stands still: no floor accrues, and retries alone deposit
	// nothing.
	for i := range 1000 {
		resp := f.get(t, "/v1/pick", HeaderTried, "b0", HeaderShedStatus, "403")
		if resp.StatusCode == 200 {
			continue
		}
		if resp.StatusCode != 403 || resp.Header.Get(HeaderShed) != "retry_budget" || resp.Header.Get("Retry-After") == "" {
			t.Fatalf("retry %d: %d shed %q retry-after %q, want 403 retry_budget with a Retry-After",
				i, resp.StatusCode, resp.Header.Get(HeaderShed), resp.Header.Get("Retry-After"))
		}
		if resp := f.get(t, "/v1/pick"); resp.StatusCode != 200 {
			t.Errorf("a first attempt after the budget is spent: %d, want 200", resp.StatusCode)
		}
		return
	}
	t.Error("1000 retries and no first attempt: the retry budget was never spent")
}
