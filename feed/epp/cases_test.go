package epp

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/fleetwatch/fleetwatch"
	"github.com/fleetwatch/fleetwatch/feed/feedtest"
)

// The peers' own Envoy-free test cases, written again as one table over a
// real gRPC stream: each row names the test it comes from (repository,
// path and commit; the snapshots read were GIE @ 84436a96 and llm-d-router
// @ ebab6879). A row whose expectation fleetwatch does not share says so
// in its name and its check ("deviation"), with the reason.
const (
	gie  = "kubernetes-sigs/gateway-api-inference-extension @ 84436a96 "
	llmd = "llm-d/llm-d-router @ ebab6879 "
)

// The pools of GIE's handler tests: three pods on 8080, and two pods on
// two ports each.
var (
	gie3 = testPool{id: "gie", addrs: []string{"10.0.0.1:8080", "10.0.0.2:8080", "10.0.0.3:8080"}}
	gie4 = testPool{id: "gie", addrs: []string{"10.0.0.1:8080", "10.0.0.1:9090", "10.0.0.2:8080", "10.0.0.2:9090"}}
)

// peerCase is one row: the messages a data plane sends, repeated, and what
// must come back.
type peerCase struct {
	name, source string
	pool         testPool // gie3 when empty
	settings     Settings // Pools, Publisher, Metrics and Seed are filled in
	msgs         func() []*extprocv3.ProcessingRequest
	repeat       int // 1 when zero
	// decisions, if not nil, are published (a fresh snapshot of the
	// pool) before the exchanges.
	decisions []fleetwatch.Backend
	check     func(t *testing.T, r *caseRun)
}

// caseRun is what a row's exchanges returned.
type caseRun struct {
	answers [][]*extprocv3.ProcessingResponse // per exchange
	picks   map[string]int                    // destination header -> exchanges
	pk      *picker
	n       *natsEnv
	source  string
}

func headersOnly() []*extprocv3.ProcessingRequest {
	return []*extprocv3.ProcessingRequest{reqHeaders(map[string]string{"content-type": "application/json"}, true)}
}

// hinted is a request whose headers and body both carry the subset hint v,
// as llm-d's integration harness builds it (test/integration/util.go
// GenerateStreamedRequestSet).
func hinted(v *structpb.Value) func() []*extprocv3.ProcessingRequest {
	return func() []*extprocv3.ProcessingRequest {
		return []*extprocv3.ProcessingRequest{
			withHint(reqHeaders(map[string]string{"hi": "mom"}, false), v),
			withHint(reqBody(`{"max_tokens":100,"model":"sql-lora","prompt":"test2","temperature":0}`, true), v),
		}
	}
}

// routedWithin checks that every exchange was routed within allowed (the
// same value in the header and the metadata), and, with cover, to each of
// them at least once.
func routedWithin(cover bool, allowed ...string) func(*testing.T, *caseRun) {
	return func(t *testing.T, r *caseRun) {
		for _, rs := range r.answers {
			if len(rs) == 0 {
				t.Fatalf("no answer")
			}
			h, m := destination(rs[0])
			if h != m || !slices.Contains(allowed, h) {
				t.Fatalf("routed to header %q, metadata %q; want one of %v in both (answers %v)", h, m, allowed, rs)
			}
		}
		if cover {
			for _, a := range allowed {
				if r.picks[a] == 0 {
					t.Errorf("%s never picked in %d exchanges (%v)", a, len(r.answers), r.picks)
				}
			}
		}
	}
}

// rejected checks an ImmediateResponse with code and reason.
func rejected(code int, reason string) func(*testing.T, *caseRun) {
	return func(t *testing.T, r *caseRun) {
		for _, rs := range r.answers {
			if len(rs) != 1 {
				t.Fatalf("answers %v: want one ImmediateResponse", rs)
			}
			if c, why, retry := immediate(rs[0]); c != code || why != reason || retry == "" {
				t.Errorf("ImmediateResponse %d, reason %q, retry-after %q; want %d, %q and a Retry-After", c, why, retry, code, reason)
			}
		}
	}
}

// bodyPassed checks that the body of one direction came back whole, ended,
// in chunks of at most MaxChunk.
func bodyPassed(request bool, want string, chunks int) func(*testing.T, *caseRun) {
	return func(t *testing.T, r *caseRun) {
		for _, rs := range r.answers {
			got, ended, n := echoed(rs, request)
			if got != want || !ended || (chunks > 0 && n != chunks) {
				t.Errorf("body passed back: %d bytes in %d chunks (ended %v); want the %d sent, ended, in %d", len(got), n, ended, len(want), chunks)
			}
		}
	}
}

// kinds is the sequence of answer kinds, for rows that fix the order.
func kinds(rs []*extprocv3.ProcessingResponse) string {
	var out []string
	for _, r := range rs {
		k := fmt.Sprintf("%T", r.GetResponse())
		out = append(out, strings.TrimPrefix(k, "*ext_procv3.ProcessingResponse_"))
	}
	return strings.Join(out, ",")
}

func answeredAs(want string) func(*testing.T, *caseRun) {
	return func(t *testing.T, r *caseRun) {
		for _, rs := range r.answers {
			if got := kinds(rs); got != want {
				t.Errorf("answers %s, want %s", got, want)
			}
		}
	}
}

func all(checks ...func(*testing.T, *caseRun)) func(*testing.T, *caseRun) {
	return func(t *testing.T, r *caseRun) {
		for _, c := range checks {
			c(t, r)
		}
	}
}

func TestPeerCases(t *testing.T) {
	for i, c := range peerCases() {
		t.Run(c.name, func(t *testing.T) {
			t.Logf("from %s", c.source)
			n := newNATS(t) // a KV bucket of its own: no row sees another's decisions
			pool := c.pool
			if pool.id == "" {
				pool = gie3
			}
			s := c.settings
			s.Source, s.Seed = fmt.Sprintf("case-%d", i), 7
			pk := startPicker(t, n, s, pool)
			if c.decisions != nil {
				pk.publish(t, n, feedtest.Snapshot(pool.id, fmt.Sprintf("case-%d", i), 1, time.Now(), c.decisions...))
			}
			r := &caseRun{picks: map[string]int{}, pk: pk, n: n, source: s.Source}
			for range max(c.repeat, 1) {
				rs, err := pk.exchange(t, c.msgs()...)
				if err != nil {
					t.Fatalf("stream: %v (answers %v)", err, rs)
				}
				if len(rs) > 0 {
					if h, _ := destination(rs[0]); h != "" {
						r.picks[h]++
					}
				}
				r.answers = append(r.answers, rs)
			}
			c.check(t, r)
		})
	}
}
