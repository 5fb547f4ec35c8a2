package serve

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/VictoriaMetrics/metrics"

	"github.com/fleetwatch/fleetwatch"
	"github.com/fleetwatch/fleetwatch/analyzer"
	"github.com/fleetwatch/fleetwatch/internal/config"
	"github.com/fleetwatch/fleetwatch/internal/promlabel"
)

// The metrics scraper (docs/DECISIONS.md "Backend load"): for every
// configured backend with a metrics_url of a pool this instance decides,
// one goroutine reads its Prometheus metrics every scrape.interval (250 ms
// by default, at least 50 ms), takes the queue and cache gauges vLLM and
// SGLang export, and hands the report to the evaluation loop through a
// bounded channel, which feeds it to the analyzer (ObserveLoad) before
// each Evaluate. A scrape never blocks the pipeline: a
// full channel drops the report and counts it, and a slow or failing
// endpoint only delays its own next read.
//
// It counts, in the server's metrics set:
//
//	fleetwatch_load_scrapes_total{pool,backend}          reads of the backend's metrics
//	fleetwatch_load_scrape_failures_total{pool,backend}  reads that gave no load (HTTP error, status, timeout, no known gauge)
//	fleetwatch_load_scrape_duration_seconds              time per read (histogram)
//	fleetwatch_load_reports_dropped_total                reports dropped because the evaluation loop was behind

// Scraper defaults (config.ScrapeSettings' zero durations).
const (
	defaultScrapeInterval = 250 * time.Millisecond
	defaultScrapeTimeout  = 800 * time.Millisecond
	// maxScrapeBody bounds a metrics page read (vLLM's is ~100 KiB with its
	// histograms).
	maxScrapeBody = 8 << 20
)

// The gauges read, by server. vLLM's kv_cache_usage_perc (and
// gpu_cache_usage_perc, its name before 0.9.2) and SGLang's token_usage are
// fractions in [0, 1] despite vLLM's "_perc" ("1 means 100 percent usage",
// vllm/v1/metrics/loggers.py); running and waiting are request counts.
const (
	gaugeRunning = iota
	gaugeWaiting
	gaugeKV
	gaugeKVOld // vLLM's older name, used only when the newer is absent
	numGauges
)

var scrapedGauges = map[string]int{
	"vllm:num_requests_running": gaugeRunning,
	"vllm:num_requests_waiting": gaugeWaiting,
	"vllm:kv_cache_usage_perc":  gaugeKV,
	"vllm:gpu_cache_usage_perc": gaugeKVOld,
	"sglang:num_running_reqs":   gaugeRunning,
	"sglang:num_queue_reqs":     gaugeWaiting,
	"sglang:token_usage":        gaugeKV,
}

// loadReading is one scraped report on its way to the analyzer.
type loadReading struct {
	pool, backend string
	report        analyzer.LoadReport
	at            time.Time
}

// scanBufs are the line buffers of parseLoadMetrics, shared by every
// target's reads: a buffer per read was 64 KiB of garbage a read (655
// MB/s at 10,000 backends read every second), one per target 64 KiB of
// memory each, and few reads are parsed at once.
var scanBufs = sync.Pool{New: func() any { b := make([]byte, 0, 64<<10); return &b }}

// parseLoadMetrics reads the gauges of a Prometheus text page. Counts are
// summed over their label sets (a server with several engines, or data
// parallel ranks, reports one series each); the KV-cache fraction is their
// mean (the engines' caches are alike). A sample that is not a finite
// number >= 0 is skipped. It reports false when the page has none of the
// gauges.
func parseLoadMetrics(r io.Reader) (analyzer.LoadReport, bool, error) {
	var sum [numGauges]float64
	var n [numGauges]int
	buf := scanBufs.Get().(*[]byte)
	defer scanBufs.Put(buf)
	sc := bufio.NewScanner(r)
	sc.Buffer((*buf)[:0], 1<<20)
	for sc.Scan() {
		line := sc.Bytes()
		if len(line) == 0 || line[0] == '#' {
			continue
		}
		end := bytes.IndexAny(line, "{ \t")
		if end <= 0 {
			continue
		}
		g, known := scrapedGauges[string(line[:end])] // no allocation: map lookup by converted bytes
		if !known {
			continue
		}
		rest := line[end:]
		if rest[0] == '{' {
			closing := labelsEnd(rest)
			if closing < 0 {
				continue
			}
			rest = rest[closing+1:]
		}
		fields := bytes.Fields(rest) // value [timestamp]
		if len(fields) == 0 {
			continue
		}
		v, err := strconv.ParseFloat(string(fields[0]), 64)
		if err != nil || !(v >= 0) || v > 1e15 { // NaN and +Inf fail
			continue
		}
		sum[g] += v
		n[g]++
	}
	if err := sc.Err(); err != nil {
		return analyzer.LoadReport{}, false, err
	}
	var rep analyzer.LoadReport
	if n[gaugeRunning] > 0 {
		rep.Running, rep.HasRunning = sum[gaugeRunning], true
	}
	if n[gaugeWaiting] > 0 {
		rep.Waiting, rep.HasWaiting = sum[gaugeWaiting], true
	}
	kv := gaugeKV
	if n[kv] == 0 {
		kv = gaugeKVOld
	}
	if n[kv] > 0 {
		if f, ok := kvFraction(sum[kv] / float64(n[kv])); ok {
			rep.KVCacheUsage, rep.HasKVCache = f, true
		}
	}
	return rep, rep.HasRunning || rep.HasWaiting || rep.HasKVCache, nil
}

// labelsEnd returns the index of the '}' closing the label set that b
// starts with, skipping quoted values (which may hold '}' and escaped
// quotes), or -1.
func labelsEnd(b []byte) int {
	quoted := false
	for i := 1; i < len(b); i++ {
		switch c := b[i]; {
		case quoted && c == '\\':
			i++
		case c == '"':
			quoted = !quoted
		case !quoted && c == '}':
			return i
		}
	}
	return -1
}

// kvFraction reads a KV-cache usage as a fraction: the servers export one
// in [0, 1]; a value in (1, 100] can only be a percent and is divided by
// 100 (the same rule as route's ORCA reports).
func kvFraction(f float64) (float64, bool) {
	switch {
	case f >= 0 && f <= 1:
		return f, true
	case f > 1 && f <= 100:
		return f / 100, true
	}
	return 0, false
}

// scraper reads the targets' metrics. Its goroutines are owned by run,
// which returns when they all have.
type scraper struct {
	targets  []config.ScrapeTarget
	interval time.Duration
	timeout  time.Duration
	out      chan<- loadReading
	now      func() time.Time
	logf     func(format string, args ...any)
	// decides reports whether this instance decides pool now (its
	// partition is live here): a pool decided elsewhere is not read, so
	// that a server answers one read an interval whatever the instances.
	decides func(pool string) bool

	transport *http.Transport
	client    *http.Client

	duration *metrics.Histogram
	dropped  *metrics.Counter
}

// newScraper returns a scraper of s's targets, those of the pools decides
// reports at each read, that sends to out and counts in set; it starts
// nothing.
func newScraper(s config.ScrapeSettings, decides func(string) bool, out chan<- loadReading, set *metrics.Set, logf func(string, ...any)) *scraper {
	sc := &scraper{
		targets:  s.Targets,
		interval: s.Interval,
		timeout:  s.Timeout,
		out:      out,
		now:      time.Now,
		logf:     logf,
		decides:  decides,
		duration: set.GetOrCreateHistogram("fleetwatch_load_scrape_duration_seconds"),
		dropped:  set.GetOrCreateCounter("fleetwatch_load_reports_dropped_total"),
	}
	if sc.interval <= 0 {
		sc.interval = defaultScrapeInterval
	}
	if sc.timeout <= 0 {
		sc.timeout = defaultScrapeTimeout
	}
	sc.transport = &http.Transport{
		Proxy:               nil, // backends are read directly, as route sends to them
		DialContext:         (&net.Dialer{Timeout: sc.timeout}).DialContext,
		MaxIdleConnsPerHost: 1,
		IdleConnTimeout:     2 * sc.interval,
	}
	sc.client = &http.Client{Transport: sc.transport, Timeout: sc.timeout}
	return sc
}

// run reads every target until ctx ends, one goroutine per target, and
// returns once they have all stopped and the idle connections are closed.
func (sc *scraper) run(ctx context.Context, set *metrics.Set) {
	var wg sync.WaitGroup
	for _, t := range sc.targets {
		labels := fmt.Sprintf("{pool=%s,backend=%s}", promlabel.Quote(t.Pool), promlabel.Quote(t.Backend))
		scrapes := set.GetOrCreateCounter("fleetwatch_load_scrapes_total" + labels)
		failures := set.GetOrCreateCounter("fleetwatch_load_scrape_failures_total" + labels)
		wg.Go(func() { sc.loop(ctx, t, scrapes, failures) })
	}
	wg.Wait()
	sc.transport.CloseIdleConnections()
}

// loop reads one target every interval, the first read at a random point
// of the first interval so that backends are not all read at once, while
// this instance decides its pool (checked at each read: a partition taken
// over is read within an interval).
func (sc *scraper) loop(ctx context.Context, t config.ScrapeTarget, scrapes, failures *metrics.Counter) {
	timer := time.NewTimer(rand.N(sc.interval))
	defer timer.Stop()
	failing := false
	for {
		select {
		case <-ctx.Done():
			return
		case <-timer.C:
		}
		if !sc.decides(t.Pool) { // another instance reads it
			timer.Reset(sc.interval)
			continue
		}
		start := time.Now()
		rep, err := sc.read(ctx, t.URL)
		sc.duration.UpdateDuration(start)
		scrapes.Inc()
		switch {
		case ctx.Err() != nil:
			return
		case err != nil:
			failures.Inc()
			if !failing {
				sc.logf("load: %s/%s: %v (counted in fleetwatch_load_scrape_failures_total; logged again once it recovers and fails anew)", t.Pool, t.Backend, err)
			}
			failing = true
		default:
			failing = false
			sc.hand(loadReading{pool: t.Pool, backend: t.Backend, report: rep, at: sc.now()})
		}
		// The next read starts an interval after this one started, or at
		// once when this one took longer.
		timer.Reset(max(0, sc.interval-time.Since(start)))
	}
}

// hand gives a reading to the evaluation loop without waiting.
func (sc *scraper) hand(r loadReading) {
	select {
	case sc.out <- r:
	default:
		sc.dropped.Inc()
	}
}

// errNoLoad: the page has none of the gauges read.
var errNoLoad = fmt.Errorf("serve: the metrics page has none of %s", "vllm:num_requests_running, vllm:num_requests_waiting, vllm:kv_cache_usage_perc, sglang:num_running_reqs, sglang:num_queue_reqs, sglang:token_usage")

// read fetches and parses one metrics page.
func (sc *scraper) read(ctx context.Context, url string) (analyzer.LoadReport, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return analyzer.LoadReport{}, err
	}
	req.Header.Set("Accept", "text/plain;version=0.0.4")
	resp, err := sc.client.Do(req)
	if err != nil {
		return analyzer.LoadReport{}, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
		return analyzer.LoadReport{}, fmt.Errorf("serve: GET %s: status %d", url, resp.StatusCode)
	}
	rep, ok, err := parseLoadMetrics(io.LimitReader(resp.Body, maxScrapeBody))
	switch {
	case err != nil:
		return rep, fmt.Errorf("serve: GET %s: %w", url, err)
	case !ok:
		return rep, errNoLoad
	}
	return rep, nil
}

// buildScraper makes the scraper of the configured metrics_url targets and
// the hand-off channel (none without targets).
func (s *Server) buildScraper() {
	ss := s.cfg.ScrapeSettings()
	// Room for a few rounds of every target: the evaluation loop drains it
	// every 100ms, so it fills only when that loop is stuck. Made without
	// targets too: a reload may add some.
	s.loads = make(chan loadReading, max(4*len(ss.Targets)+16, 256))
	if len(ss.Targets) == 0 {
		return
	}
	s.scraper = newScraper(ss, s.decides, s.loads, s.metrics, s.logf)
}

// decides reports whether this instance decides pool now: its partition
// is live here (every pool without JetStream).
func (s *Server) decides(pool string) bool {
	return s.leases.View().Live(fleetwatch.PartitionOf(pool, s.leases.Partitions()))
}

// drainLoads feeds the readings handed over since the last call to the
// analyzer; the evaluation loop calls it before each Evaluate.
func (s *Server) drainLoads() {
	for {
		select {
		case r := <-s.loads:
			s.an.ObserveLoad(r.pool, r.backend, r.report, r.at)
		default:
			return
		}
	}
}
