package main

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/fleetwatch/fleetwatch/feed/feedtest"
	"github.com/fleetwatch/fleetwatch/internal/fakeai"
	"github.com/fleetwatch/fleetwatch/internal/testkit"
)

// BenchmarkNginxPick measures what asking the pick service costs a request
// through nginx (issue 32: nginx + /v1/pick at most 0.5 ms above nginx
// alone at p50). One nginx 1.22 process serves two ports: the steered
// configuration of docs/INTEGRATIONS.md "nginx steered by fleetwatch"
// (auth_request to `fleetwatch epp`'s /v1/pick for every request, the pick
// service following a real serve) and a plain server that proxies to the
// same three fake backends (no TTFT, 4 tokens) through the configuration's
// own round-robin upstream. b.N requests go to each, one at a time from one
// client, alternating which goes first; each steered answer must name the
// backend picked (not failed open). Reported: p50 and p99 of each in µs and
// the p50 added by the pick. ns/op is both requests together.
func BenchmarkNginxPick(b *testing.B) {
	nginxBin := testkit.RequireTool(b, "/usr/sbin/nginx", "nginx")
	bin := fleetwatchBinary(b)
	natsURL, _ := feedtest.NewServer(b)
	backends := testkit.StartFakeBackends(b, 3)
	for _, s := range backends {
		s.SetBehavior(fakeai.Behavior{})
	}
	cfg := routeConfig(b, natsURL, backends, "")
	startServe(b, bin, cfg, natsURL)
	pickAddr := freeLoopbackAddr(b)
	startPickService(b, cfg, pickAddr)
	plainAddr := freeLoopbackAddr(b)
	plainServer := fmt.Sprintf("    server {\n        listen %s;\n        proxy_http_version 1.1;\n"+
		"        location /v1/ {\n            proxy_pass http://llama_unsteered;\n            proxy_set_header Connection \"\";\n        }\n    }\n", plainAddr)
	steered := testkit.NewChatClient(startSteeredNginx(b, nginxBin, b.TempDir(), backends, pickAddr, plainServer))
	plain := testkit.NewChatClient("http://" + plainAddr)
	eventually(b, 30*time.Second, "nginx to steer by the pick service", func() bool {
		r, err := steered.Chat("", "warm up", false)
		return err == nil && r.Status == 200 && r.Backend != ""
	})
	send := func(c *testing.B, client *testkit.ChatClient, steer bool) time.Duration {
		start := time.Now()
		r, err := client.Chat("", "how are you", false)
		took := time.Since(start)
		if err != nil || r.Status != 200 || (steer && r.Backend == "") {
			c.Fatalf("steered %v: status %d, backend %q, %v", steer, r.Status, r.Backend, err)
		}
		return took
	}
	for range 200 { // connections and caches warm on both sides
		send(b, plain, false)
		send(b, steered, true)
	}
	plainT := make([]time.Duration, 0, b.N)
	steeredT := make([]time.Duration, 0, b.N)
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		if i%2 == 0 {
			plainT = append(plainT, send(b, plain, false))
			steeredT = append(steeredT, send(b, steered, true))
		} else {
			steeredT = append(steeredT, send(b, steered, true))
			plainT = append(plainT, send(b, plain, false))
		}
	}
	b.StopTimer()
	slices.Sort(plainT)
	slices.Sort(steeredT)
	q := func(d []time.Duration, p float64) float64 {
		return float64(d[min(len(d)-1, int(p*float64(len(d))))].Nanoseconds()) / 1e3
	}
	b.ReportMetric(q(plainT, 0.5), "nginx-p50-µs")
	b.ReportMetric(q(steeredT, 0.5), "steered-p50-µs")
	b.ReportMetric(q(steeredT, 0.5)-q(plainT, 0.5), "p50-added-µs")
	b.ReportMetric(q(plainT, 0.99), "nginx-p99-µs")
	b.ReportMetric(q(steeredT, 0.99), "steered-p99-µs")
}
