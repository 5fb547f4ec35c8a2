package bench

import (
	"bytes"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/fleetwatch/fleetwatch/internal/testkit"
)

// TestRunPeersShort runs a few seconds of the incident script through
// fleetwatch's router, HAProxy and nginx, and checks the table: one row per
// phase and balancer, in order, and every balancer carried traffic in every
// phase (its requests reached the backends). Times are not checked.
func TestRunPeersShort(t *testing.T) {
	for _, routers := range []int{1, 2} {
		t.Run(strconv.Itoa(routers), func(t *testing.T) { runPeersShort(t, routers, "") })
	}
}

// runPeersShort is the short run with routers instances of each balancer,
// and Portkey's gateway too when portkey (its install) is set.
func runPeersShort(t *testing.T, routers int, portkey string) {
	haproxy := testkit.RequireTool(t, "/usr/sbin/haproxy", "haproxy")
	nginx := testkit.RequireTool(t, "/usr/sbin/nginx", "nginx")
	r, err := RunPeers(t.Context(), PeersSettings{
		HAProxy: haproxy, Nginx: nginx, Portkey: portkey,
		// Budgets far above the backends' 40 ms: in a full test run the
		// other packages' servers share the two cores, and with 300 ms of
		// first-byte budget and 1 s phases every balancer timed out most
		// requests there (p50 0.4-4 s) and some carried none in a phase.
		Phase: 2 * time.Second, Rate: 20, FirstByte: 2 * time.Second, ClientTimeout: 10 * time.Second,
		Routers: routers, Logf: t.Logf,
	})
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := r.WriteMarkdown(&out); err != nil {
		t.Fatal(err)
	}
	t.Logf("\n%s", out.String())

	var header string
	var got [][2]string // phase, balancer
	for _, line := range strings.Split(out.String(), "\n") {
		if !strings.HasPrefix(line, "| ") || strings.HasPrefix(line, "| ---") {
			continue
		}
		if header == "" {
			header = line
			continue
		}
		cells := strings.Split(strings.Trim(line, "| "), " | ")
		if len(cells) != 8 {
			t.Fatalf("row %q has %d cells, want 8", line, len(cells))
		}
		got = append(got, [2]string{cells[0], cells[1]})
		requests, err := strconv.Atoi(cells[2])
		if err != nil || requests == 0 {
			t.Errorf("%s / %s: requests %q, want a count > 0", cells[0], cells[1], cells[2])
		}
		if perReq, err := strconv.ParseFloat(cells[7], 64); err != nil || perReq <= 0 {
			t.Errorf("%s / %s: attempts per request %q: the balancer carried no traffic to the backends", cells[0], cells[1], cells[7])
		}
		if cells[0] != "healthy" && !strings.HasSuffix(cells[6], "%") {
			t.Errorf("%s / %s: broken backend's share %q, want a percentage", cells[0], cells[1], cells[6])
		}
	}
	if header != PeersTableHeader {
		t.Errorf("header %q, want %q", header, PeersTableHeader)
	}
	balancers := peerNames
	if portkey != "" {
		balancers = append(slices.Clone(peerNames), PeerPortkey)
	}
	if diff := cmp.Diff(balancers, r.Balancers); diff != "" {
		t.Errorf("balancers (-want +got):\n%s", diff)
	}
	var want [][2]string
	for _, ph := range peerPhases {
		for _, b := range balancers {
			want = append(want, [2]string{ph.name, b})
		}
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("rows (-want +got):\n%s", diff)
	}
	if routers > 1 && !strings.Contains(out.String(), strconv.Itoa(routers)+" instances of each balancer") {
		t.Errorf("the table does not say it ran %d instances of each balancer", routers)
	}
	if !strings.Contains(out.String(), "share of fleetwatch's attempts against each peer's") {
		t.Errorf("the table lacks the shares' ratios")
	}
	for _, row := range r.Rows {
		if row.Phase == peerPhases[0].name && row.Errors > row.Requests/2 {
			t.Errorf("%s / %s: %d client errors of %d requests with every backend healthy", row.Phase, row.Balancer, row.Errors, row.Requests)
		}
		if row.Attempts < int64(row.Requests) {
			t.Errorf("%s / %s: %d attempts for %d requests: some requests never reached a backend", row.Phase, row.Balancer, row.Attempts, row.Requests)
		}
	}
}

// TestPeersBrokenShareAgainstNginx runs the incident script for a few
// seconds a phase (120 requests per phase and balancer) and checks what
// docs/EVALUATION.md "Real peers" reports of fleetwatch against nginx: in
// each phase with a broken backend (fails fast, answers 429, stalls),
// fleetwatch's router sends it a share of its attempts within 8 points of
// nginx's (least_conn with max_fails=3: about 3 attempts before it takes
// the server out; fleetwatch's breaker opens after 5 failures in a row or
// 5 hinted 429s, or 2 stalls), 12 points in the stall phase: with this
// run's 300 ms first-byte budget a stall is known only after 300 ms and
// the breaker needs two, so fleetwatch sent 11-13 attempts there to
// nginx's 3-4 (8-10% against 2.4-3.3%; 5 against 3 when failing fast or
// answering 429, in three runs). The margins are wide because a phase's
// figure is a handful of attempts, and on a loaded machine the feed may
// take a few hundred ms more to open the breaker (at 20 requests/s, 4
// more attempts). With the analyzer's breakers off (min_requests and the
// runs out of reach) fleetwatch sent the fast-failing and the throttling
// backend 27% and 26% of its attempts, and this test failed; the stalled
// one 11.8%, within the stall margin: in so short a phase what keeps a
// stall's share low is its in-flight count, not its breaker.
func TestPeersBrokenShareAgainstNginx(t *testing.T) {
	haproxy := testkit.RequireTool(t, "/usr/sbin/haproxy", "haproxy")
	nginx := testkit.RequireTool(t, "/usr/sbin/nginx", "nginx")
	r, err := RunPeers(t.Context(), PeersSettings{
		HAProxy: haproxy, Nginx: nginx, Balancers: []string{PeerFleetwatch, PeerNginx},
		Phase: 6 * time.Second, Rate: 20, FirstByte: 300 * time.Millisecond, ClientTimeout: 5 * time.Second,
		Routers: 1, Logf: t.Logf,
	})
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := r.WriteMarkdown(&out); err != nil {
		t.Fatal(err)
	}
	t.Logf("\n%s", out.String())
	share := func(phase, balancer string) (float64, *PeerRow) {
		for i, row := range r.Rows {
			if row.Phase == phase && row.Balancer == balancer && row.HasBroken && row.Attempts > 0 {
				return float64(row.BrokenAttempts) / float64(row.Attempts), &r.Rows[i]
			}
		}
		t.Fatalf("no row with attempts for %s / %s", phase, balancer)
		return 0, nil
	}
	for _, ph := range peerPhases {
		if ph.broken < 0 {
			continue
		}
		margin := 0.08
		if ph.name == "b3 stalls" {
			margin = 0.12
		}
		fw, fwRow := share(ph.name, PeerFleetwatch)
		ng, ngRow := share(ph.name, PeerNginx)
		t.Logf("%s: broken backend's share fleetwatch %.1f%% (%d of %d attempts), nginx %.1f%% (%d of %d)",
			ph.name, 100*fw, fwRow.BrokenAttempts, fwRow.Attempts, 100*ng, ngRow.BrokenAttempts, ngRow.Attempts)
		if fw > ng+margin {
			t.Errorf("%s: fleetwatch sent the broken backend %.1f%% of its attempts, nginx %.1f%%: want at most %.0f points more",
				ph.name, 100*fw, 100*ng, 100*margin)
		}
		if fwRow.Errors > 0 {
			t.Errorf("%s: %d client errors through fleetwatch's router, want 0 (every failed attempt is retried)", ph.name, fwRow.Errors)
		}
	}
}

func TestQuantile(t *testing.T) {
	v := []float64{5, 1, 4, 2, 3, 10, 9, 8, 7, 6}
	for _, c := range []struct{ q, want float64 }{{0.5, 5}, {0.99, 10}, {0.1, 1}, {0, 1}} {
		if got := quantile(v, c.q); got != c.want {
			t.Errorf("quantile(%v) = %v, want %v", c.q, got, c.want)
		}
	}
	if got := quantile(nil, 0.5); got == got {
		t.Errorf("quantile of nothing = %v, want NaN", got)
	}
}

// TestPeersSteeredNginx runs the incident script through 8 nginx
// instances that each learn alone and 8 steered by one pick service
// (docs/EVALUATION.md "Fleet scale"), for a few seconds a phase, and
// checks the direction of the goal: in the fast-failure and 429
// phases the broken backend's share of steered nginx's attempts is at
// most a quarter of nginx's, and no request of steered nginx fails. The
// attempts before the breaker opens (five to trip it, and those sent while
// the decision travels) are a fixed cost that a phase amortizes: with 25 s
// phases a loaded CI run's 429 phase gave 1.8% against nginx's 6.0% (alone:
// 1.0-1.2%), so the phases are 45 s.
func TestPeersSteeredNginx(t *testing.T) {
	nginx := testkit.RequireTool(t, "/usr/sbin/nginx", "nginx")
	r, err := RunPeers(t.Context(), PeersSettings{
		Nginx: nginx, Balancers: []string{PeerNginx, PeerSteeredNginx}, Seed: 1, Phases: 3,
		Healthy: 3 * time.Second, Phase: 45 * time.Second, Rate: 20, FirstByte: 2 * time.Second, ClientTimeout: 10 * time.Second,
		Routers: 8, Logf: t.Logf,
	})
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := r.WriteMarkdown(&out); err != nil {
		t.Fatal(err)
	}
	t.Logf("\n%s", out.String())
	for _, ph := range peerPhases {
		for _, row := range r.Rows {
			if row.Phase == ph.name && row.Balancer == PeerSteeredNginx && row.Errors > 0 {
				t.Errorf("%s: %d of %d requests through steered nginx failed, want none", ph.name, row.Errors, row.Requests)
			}
		}
		if ph.broken != 1 && ph.broken != 2 {
			continue
		}
		steered, plain := r.Share(ph.name, PeerSteeredNginx), r.Share(ph.name, PeerNginx)
		if !(steered <= plain/4) {
			t.Errorf("%s: the broken backend got %.1f%% of steered nginx's attempts, %.1f%% of nginx's: want at most a quarter",
				ph.name, 100*steered, 100*plain)
		}
	}
}
