package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/fleetwatch/fleetwatch/feed"
	"github.com/fleetwatch/fleetwatch/internal/testkit"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fleetwatch/fleetwatch"
	"github.com/fleetwatch/fleetwatch/internal/control"
	"github.com/fleetwatch/fleetwatch/internal/fakeai"
)

// natsPasswords are the passwords the tests give deploy/nats/nats.conf
// through its environment variables.
var natsPasswords = map[string]string{
	"FLEETWATCH_NATS_PASSWORD": "fw-secret",
	"PROXY_NATS_PASSWORD":      "proxy-secret",
	"ROUTER_NATS_PASSWORD":     "router-secret",
	"NATS_ADMIN_PASSWORD":      "admin-secret",
}

// startEmbeddedDeployNATS runs deploy/nats/nats.conf in the embedded server
// on a random loopback port.
func startEmbeddedDeployNATS(t *testing.T, conf string) string {
	for k, v := range natsPasswords {
		t.Setenv(k, v)
	}
	opts, err := server.ProcessConfigFile(conf)
	if err != nil {
		t.Fatalf("%s: %v", conf, err)
	}
	opts.Host, opts.Port, opts.HTTPPort = "127.0.0.1", -1, 0
	opts.StoreDir = t.TempDir()
	opts.NoLog, opts.NoSigs = true, true
	return runEmbeddedNATS(t, opts)
}

const debianNATSServer = "/usr/sbin/nats-server"

// startDebianDeployNATS runs deploy/nats/nats.conf in Debian's nats-server
// (2.9) process.
func startDebianDeployNATS(t *testing.T, conf string) string {
	bin := debianNATSServer
	if _, err := os.Stat(bin); err != nil {
		bin = "/usr/bin/nats-server"
	}
	testkit.RequireTool(t, bin, "nats-server")
	var env []string
	for k, v := range natsPasswords {
		env = append(env, k+"="+v)
	}
	return startNATSServerProcess(t, bin, env, "-c", conf, "-sd", t.TempDir())
}

// asyncErrors collects a connection's asynchronous errors (permission
// violations arrive that way).
type asyncErrors struct {
	mu   sync.Mutex // guards errs
	errs []error
}

func (a *asyncErrors) handler(_ *nats.Conn, _ *nats.Subscription, err error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.errs = append(a.errs, err)
}

// waitViolation waits for a permissions violation naming subject.
func (a *asyncErrors) waitViolation(t *testing.T, subject string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		a.mu.Lock()
		for _, err := range a.errs {
			if errors.Is(err, nats.ErrPermissionViolation) && strings.Contains(err.Error(), `"`+subject+`"`) {
				a.mu.Unlock()
				return
			}
		}
		a.mu.Unlock()
		time.Sleep(20 * time.Millisecond)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	t.Errorf("no permissions violation for %s (errors: %v)", subject, a.errs)
}

func connectAs(t *testing.T, url, user string) (*nats.Conn, *asyncErrors) {
	t.Helper()
	errs := &asyncErrors{}
	pw := map[string]string{"fleetwatch": "FLEETWATCH_NATS_PASSWORD", "proxy": "PROXY_NATS_PASSWORD", "router": "ROUTER_NATS_PASSWORD"}[user]
	nc, err := nats.Connect(url, nats.UserInfo(user, natsPasswords[pw]), nats.Name(user), nats.ErrorHandler(errs.handler))
	if err != nil {
		t.Fatalf("connect as %s: %v", user, err)
	}
	t.Cleanup(nc.Close)
	return nc, errs
}

// recvNext returns the next message or fails after a bound meant for a
// broken server, not a performance requirement.
func recvNext(t *testing.T, sub *nats.Subscription) *nats.Msg {
	t.Helper()
	m, err := sub.NextMsg(5 * time.Second)
	if err != nil {
		t.Fatalf("no message on %s: %v", sub.Subject, err)
	}
	return m
}

func TestDeployNATSPermissions(t *testing.T) {
	conf := filepath.Join(repoRoot(t), "deploy", "nats", "nats.conf")
	servers := []struct {
		name  string
		start func(*testing.T, string) string
	}{
		{"embedded", startEmbeddedDeployNATS},
		{"debian-nats-server", startDebianDeployNATS},
	}
	for _, srv := range servers {
		t.Run(srv.name, func(t *testing.T) {
			url := srv.start(t, conf)
			checkDeployPermissions(t, url)
			checkCompactFeedPermissions(t, url)
		})
	}
}

// checkCompactFeedPermissions: serve's user publishes the compact feed and
// stores its key frames; a router follows it (a direct get at start, the
// frames on fw.feed.<pool>) and cannot store a key frame.
func checkCompactFeedPermissions(t *testing.T, url string) {
	fw, _ := connectAs(t, url, "fleetwatch")
	pub, err := feed.NewPublisher(t.Context(), fw, feed.PublisherSettings{})
	if err != nil {
		t.Fatal(err)
	}
	snap := feedtestSnapshot("pool-c", 1)
	if err := pub.Publish(t.Context(), snap); err != nil {
		t.Fatal(err)
	}
	if err := pub.Flush(t.Context()); err != nil {
		t.Fatal(err)
	}
	router, routerErrs := connectAs(t, url, "router")
	w, err := feed.NewWatcher(router, feed.WatcherSettings{Compact: true, Pools: []string{"pool-c"}})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- w.Run(t.Context()) }()
	t.Cleanup(func() { w.Close(); <-done })
	<-w.Synced()
	if !w.Compact() {
		t.Fatalf("the router does not follow the compact feed (permissions?): %v", routerErrs.errs)
	}
	if v, ok := w.View("pool-c"); !ok || v.Snapshot.Seq != 1 {
		t.Errorf("the router's view of pool-c after joining: %+v, %v", v.Snapshot, ok)
	}
	next := feedtestSnapshot("pool-c", 2)
	next.Backends[0].Weight = 0.5
	if err := pub.Publish(t.Context(), next); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 10*time.Second, "the next key frame on fw.feed.pool-c", func() bool {
		v, _ := w.View("pool-c")
		return v.Snapshot != nil && v.Snapshot.Seq == 2
	})
	// A router that missed frames asks serve for a key frame.
	asked, err := fw.SubscribeSync("fw.resync.>")
	if err != nil {
		t.Fatal(err)
	}
	if err := fw.Flush(); err != nil {
		t.Fatal(err)
	}
	if err := router.Publish("fw.resync.pool-c", nil); err != nil {
		t.Fatal(err)
	}
	if m, err := asked.NextMsg(5 * time.Second); err != nil {
		routerErrs.mu.Lock()
		t.Errorf("the router's resync request did not reach fleetwatch: %v (router errors: %v)", err, routerErrs.errs)
		routerErrs.mu.Unlock()
	} else if m.Subject != "fw.resync.pool-c" {
		t.Errorf("fleetwatch received %q, want fw.resync.pool-c", m.Subject)
	}
	if err := router.Publish("$KV.fw_feed.pool-c", []byte("forged")); err != nil {
		t.Fatal(err)
	}
	routerErrs.waitViolation(t, "$KV.fw_feed.pool-c")
}

// feedtestSnapshot is a valid one-backend snapshot of pool.
func feedtestSnapshot(pool string, seq uint64) *fleetwatch.Snapshot {
	return &fleetwatch.Snapshot{V: fleetwatch.ProtocolVersion, Pool: pool, Epoch: "e1", Seq: seq,
		At: fleetwatch.At(time.Now()), TTLMs: 60000, Mode: fleetwatch.ModeBalance, AllOpen: fleetwatch.AllOpenShed,
		AffinityTolerance: fleetwatch.DefaultAffinityTolerance,
		Backends:          []fleetwatch.Backend{{Backend: "b1", State: fleetwatch.StateClosed, Weight: 1, Drift: fleetwatch.DriftUnknown}}}
}

func checkDeployPermissions(t *testing.T, url string) {
	subj := fleetwatch.Subjects{}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	// A wrong password is refused.
	if nc, err := nats.Connect(url, nats.UserInfo("router", "wrong")); err == nil {
		nc.Close()
		t.Error("router connected with a wrong password")
	}

	// fleetwatch: creates the bucket and publishes a decision.
	fw, _ := connectAs(t, url, "fleetwatch")
	fwJS, err := jetstream.New(fw)
	if err != nil {
		t.Fatal(err)
	}
	kv, err := fwJS.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: subj.BucketDecisions(), History: 1})
	if err != nil {
		t.Fatalf("fleetwatch creates the %s bucket: %v", subj.BucketDecisions(), err)
	}
	if _, err := kv.Put(ctx, "pool-a", []byte(`{"v":1,"seq":1}`)); err != nil {
		t.Fatalf("fleetwatch puts a decision: %v", err)
	}
	// Every other bucket serve writes: a put (publish on $KV.<bucket>.<key>)
	// and a watch, as serve does, with its user's permissions.
	for _, bucket := range []string{control.BucketDriftState(subj), subj.BucketOverrides(), subj.BucketLeases(), subj.BucketBaselines()} {
		bkv, err := fwJS.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: bucket, History: 1})
		if err != nil {
			t.Fatalf("fleetwatch creates the %s bucket: %v", bucket, err)
		}
		putCtx, putCancel := context.WithTimeout(ctx, 2*time.Second)
		_, err = bkv.Put(putCtx, "pool-a.YmFja2VuZA", []byte(`{}`))
		putCancel()
		if err != nil {
			t.Errorf("fleetwatch puts into %s: %v", bucket, err)
			continue
		}
		w, err := bkv.WatchAll(ctx)
		if err != nil {
			t.Errorf("fleetwatch watches %s: %v", bucket, err)
			continue
		}
		select {
		case e := <-w.Updates():
			if e == nil || string(e.Value()) != `{}` {
				t.Errorf("fleetwatch's watch of %s: %v", bucket, e)
			}
		case <-ctx.Done():
			t.Errorf("fleetwatch's watch of %s: nothing", bucket)
		}
		w.Stop()
	}
	outcomes, err := fw.SubscribeSync(subj.OutcomesWildcard())
	if err != nil {
		t.Fatal(err)
	}
	outcomesBare, err := fw.SubscribeSync(subj.Outcomes())
	if err != nil {
		t.Fatal(err)
	}
	decisions, err := fw.SubscribeSync(subj.DecisionsWildcard())
	if err != nil {
		t.Fatal(err)
	}
	if err := fw.Flush(); err != nil {
		t.Fatal(err)
	}

	// proxy: outcomes yes, decisions no, reading decisions no.
	proxy, proxyErrs := connectAs(t, url, "proxy")
	if err := proxy.Publish(subj.Decisions("pool-a"), []byte("forged")); err != nil {
		t.Fatal(err)
	}
	if err := proxy.Publish(subj.Outcomes()+".proxy-1", []byte("outcome-1")); err != nil {
		t.Fatal(err)
	}
	if err := proxy.Publish(subj.Outcomes(), []byte("outcome-bare")); err != nil {
		t.Fatal(err)
	}
	if _, err := proxy.SubscribeSync(subj.DecisionsWildcard()); err != nil {
		t.Fatal(err)
	}
	if err := proxy.Flush(); err != nil {
		t.Fatal(err)
	}
	if m := recvNext(t, outcomes); string(m.Data) != "outcome-1" {
		t.Errorf("fleetwatch got %q on %s, want the proxy's outcome", m.Data, m.Subject)
	}
	if m := recvNext(t, outcomesBare); string(m.Data) != "outcome-bare" {
		t.Errorf("fleetwatch got %q on %s, want the proxy's outcome", m.Data, m.Subject)
	}
	proxyErrs.waitViolation(t, subj.Decisions("pool-a"))
	proxyErrs.waitViolation(t, subj.DecisionsWildcard())
	if _, err := kv.Get(ctx, "pool-a"); err != nil {
		t.Fatal(err)
	}

	// router: reads decisions (subscription, KV get and watch), publishes
	// its outcomes, and cannot forge a decision on either path.
	router, routerErrs := connectAs(t, url, "router")
	routerDecisions, err := router.SubscribeSync(subj.DecisionsWildcard())
	if err != nil {
		t.Fatal(err)
	}
	if err := router.Flush(); err != nil {
		t.Fatal(err)
	}
	rJS, err := jetstream.New(router)
	if err != nil {
		t.Fatal(err)
	}
	rKV, err := rJS.KeyValue(ctx, subj.BucketDecisions())
	if err != nil {
		t.Fatalf("router opens the bucket: %v", err)
	}
	entry, err := rKV.Get(ctx, "pool-a")
	if err != nil {
		t.Fatalf("router kv get: %v", err)
	}
	if string(entry.Value()) != `{"v":1,"seq":1}` {
		t.Errorf("router read %q", entry.Value())
	}
	watch, err := rKV.Watch(ctx, "pool-a")
	if err != nil {
		t.Fatalf("router kv watch: %v", err)
	}
	defer watch.Stop()
	nextUpdate := func() jetstream.KeyValueEntry {
		t.Helper()
		for {
			select {
			case e := <-watch.Updates():
				if e != nil { // nil marks the end of the initial values
					return e
				}
			case <-ctx.Done():
				t.Fatal("no update from the watch")
			}
		}
	}
	if e := nextUpdate(); string(e.Value()) != `{"v":1,"seq":1}` {
		t.Errorf("watch: initial value %q", e.Value())
	}
	if _, err := kv.Put(ctx, "pool-a", []byte(`{"v":1,"seq":2}`)); err != nil {
		t.Fatal(err)
	}
	if e := nextUpdate(); string(e.Value()) != `{"v":1,"seq":2}` {
		t.Errorf("watch: update %q", e.Value())
	}
	if err := fw.Publish(subj.Decisions("pool-a"), []byte("real")); err != nil {
		t.Fatal(err)
	}
	if m := recvNext(t, routerDecisions); string(m.Data) != "real" {
		t.Errorf("router got %q on %s", m.Data, m.Subject)
	}

	putCtx, putCancel := context.WithTimeout(ctx, time.Second)
	defer putCancel()
	if _, err := rKV.Put(putCtx, "pool-a", []byte("forged")); err == nil {
		t.Error("router could put a decision into the KV bucket")
	}
	routerErrs.waitViolation(t, "$KV."+subj.BucketDecisions()+".pool-a")
	if err := router.Publish(subj.Decisions("pool-a"), []byte("forged")); err != nil {
		t.Fatal(err)
	}
	if err := router.Publish(subj.Outcomes()+".router-1", []byte("outcome-2")); err != nil {
		t.Fatal(err)
	}
	if err := router.Flush(); err != nil {
		t.Fatal(err)
	}
	routerErrs.waitViolation(t, subj.Decisions("pool-a"))
	// The router's outcome arrives; the forged decision, published before it
	// on the same connection, would have arrived first.
	if m := recvNext(t, outcomes); string(m.Data) != "outcome-2" {
		t.Errorf("fleetwatch got %q, want the router's outcome", m.Data)
	}
	for {
		m, err := decisions.NextMsg(0)
		if err != nil {
			break
		}
		if string(m.Data) != "real" {
			t.Errorf("fleetwatch saw a forged decision %q on %s", m.Data, m.Subject)
		}
	}
	// The stored value is still fleetwatch's.
	if e, err := kv.Get(ctx, "pool-a"); err != nil || string(e.Value()) != `{"v":1,"seq":2}` {
		t.Errorf("stored decision after the router's attempts: %v, %v", e, err)
	}
	// Deleting the bucket is fleetwatch's business only.
	delCtx, delCancel := context.WithTimeout(ctx, time.Second)
	defer delCancel()
	if err := rJS.DeleteKeyValue(delCtx, subj.BucketDecisions()); err == nil {
		t.Error("router deleted the decisions bucket")
	}
}

// TestDeployNATSWithServe runs a real `fleetwatch serve` as the fleetwatch
// user of deploy/nats/nats.conf: it must start, take the proxy's outcome
// events and publish decisions that the router user reads from the KV
// bucket, without a single permissions violation.
func TestDeployNATSWithServe(t *testing.T) {
	t.Parallel() // a long test of its own processes (or CPU): it overlaps the rest of the package
	conf := filepath.Join(repoRoot(t), "deploy", "nats", "nats.conf")
	url := startDebianDeployNATS(t, conf)
	p := startServeProcessEnv(t, "prefix: fw\n",
		[]string{"NATS_USER=fleetwatch", "NATS_PASSWORD=" + natsPasswords["FLEETWATCH_NATS_PASSWORD"]},
		"--nats", url)

	proxy, proxyErrs := connectAs(t, url, "proxy")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	router, routerErrs := connectAs(t, url, "router")
	js, err := jetstream.New(router)
	if err != nil {
		t.Fatal(err)
	}
	subj := fleetwatch.Subjects{}
	var snap fleetwatch.Snapshot
	for {
		ts := fleetwatch.FormatTime(time.Now())
		for _, b := range []string{"vllm-a", "vllm-b"} {
			ev := fmt.Sprintf(`{"v":1,"pool":"deploy-pool","backend":%q,"ts":%q,"status":200,"outcome":"ok","ttft_ms":150}`, b, ts)
			if err := proxy.Publish(subj.Outcomes()+".proxy-1", []byte(ev)); err != nil {
				t.Fatal(err)
			}
		}
		if kv, err := js.KeyValue(ctx, subj.BucketDecisions()); err == nil {
			if e, err := kv.Get(ctx, "deploy-pool"); err == nil {
				if err := json.Unmarshal(e.Value(), &snap); err != nil {
					t.Fatalf("decision in the KV bucket: %v: %s", err, e.Value())
				}
				if len(snap.Backends) == 2 {
					break
				}
			}
		}
		select {
		case <-ctx.Done():
			t.Fatalf("no decision for deploy-pool with 2 backends in %s (last %+v)", subj.BucketDecisions(), snap)
		case <-time.After(200 * time.Millisecond):
		}
	}
	if snap.Pool != "deploy-pool" || snap.Backends[0].Backend != "vllm-a" {
		t.Errorf("decision %+v", snap)
	}

	// The reference router runs as the router user: it reads the decisions
	// (KV and subject) and publishes its outcome events.
	backend := httptest.NewServer(fakeai.New(fakeai.Settings{Name: "vllm-a"}))
	t.Cleanup(backend.Close)
	cfgPath := filepath.Join(t.TempDir(), "route.yaml")
	routeCfg := fmt.Sprintf("pools:\n  - id: deploy-pool\n    models: [deploy]\n    backends:\n      - id: vllm-a\n        url: %s\n", backend.URL)
	if err := os.WriteFile(cfgPath, []byte(routeCfg), 0o644); err != nil {
		t.Fatal(err)
	}
	base := startRouteProcess(t, []string{"NATS_USER=router", "NATS_PASSWORD=" + natsPasswords["ROUTER_NATS_PASSWORD"]},
		"--nats", url, "--config", cfgPath, "--source", "deploy-router")
	for {
		if n, _ := metricValue(t, base+"/metrics", "fleetwatch_feed_snapshots_applied_total"); n > 0 {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatal("the router applied no decision")
		case <-time.After(100 * time.Millisecond):
		}
	}
	res, err := http.Post(base+"/v1/chat/completions", "application/json", strings.NewReader(`{"model":"deploy","messages":[{"role":"user","content":"hi"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusOK {
		t.Errorf("request through the router: %s", res.Status)
	}
	for {
		if n, _ := metricValue(t, base+"/metrics", "fleetwatch_route_events_published_total"); n > 0 {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatal("the router published no outcome event")
		case <-time.After(100 * time.Millisecond):
		}
	}
	for _, errs := range []*asyncErrors{proxyErrs, routerErrs} {
		errs.mu.Lock()
		for _, err := range errs.errs {
			t.Errorf("client error: %v", err)
		}
		errs.mu.Unlock()
	}
	if out := p.logs.String(); strings.Contains(strings.ToLower(out), "permission") {
		t.Errorf("fleetwatch serve reports a permission problem:\n%s", out)
	}
}

// TestDeployNATSConfsAgree: nats-cluster.conf's users and permissions are
// nats.conf's (TestDeployNATSPermissions checks those against a real
// server), so a right added to one is added to both.
func TestDeployNATSConfsAgree(t *testing.T) {
	accounts := func(name string) string {
		data, err := os.ReadFile(filepath.Join(repoRoot(t), "deploy", "nats", name))
		if err != nil {
			t.Fatal(err)
		}
		_, after, ok := strings.Cut(string(data), "\naccounts {")
		if !ok {
			t.Fatalf("%s has no accounts block", name)
		}
		return after
	}
	if diff := cmp.Diff(accounts("nats.conf"), accounts("nats-cluster.conf")); diff != "" {
		t.Errorf("the accounts blocks of nats.conf and nats-cluster.conf differ (-nats.conf +nats-cluster.conf):\n%s", diff)
	}
}
