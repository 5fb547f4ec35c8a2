package serve

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/VictoriaMetrics/metrics"

	"github.com/fleetwatch/fleetwatch/internal/config"
	"github.com/fleetwatch/fleetwatch/internal/testkit"
)

// vllmPage is a metrics page the size of a vLLM server's with two engines:
// the three gauges serve reads among 14 histograms of 30 buckets per
// engine and a few counters: 108 KB of lines like vLLM's.
func vllmPage() []byte {
	var b bytes.Buffer
	const model = `model_name="meta-llama/Llama-3.1-8B-Instruct"`
	for _, g := range []string{"vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc"} {
		fmt.Fprintf(&b, "# HELP %s A gauge.\n# TYPE %s gauge\n", g, g)
		for e := range 2 {
			fmt.Fprintf(&b, "%s{engine=\"%d\",%s} %d.0\n", g, e, model, e+1)
		}
	}
	for h := range 14 {
		name := fmt.Sprintf("vllm:request_histogram_%d_seconds", h)
		fmt.Fprintf(&b, "# HELP %s A histogram.\n# TYPE %s histogram\n", name, name)
		for e := range 2 {
			for k := range 30 {
				fmt.Fprintf(&b, "%s_bucket{engine=\"%d\",le=\"%g\",%s} %d.0\n", name, e, 0.001*float64(int(1)<<(k/2)), model, 100*k)
			}
			fmt.Fprintf(&b, "%s_sum{engine=\"%d\",%s} 1234.5\n%s_count{engine=\"%d\",%s} 3000.0\n", name, e, model, name, e, model)
		}
	}
	for c := range 20 {
		fmt.Fprintf(&b, "# TYPE vllm:counter_%d_total counter\nvllm:counter_%d_total{engine=\"0\",%s} 98765.0\n", c, c, model)
	}
	return b.Bytes()
}

// BenchmarkParseLoadMetrics: one scrape's parse of a vLLM-sized page
// (BENCHMARKS.md "A scrape of a backend's metrics"), against the same
// bytes only split into lines (the floor of any line parser), in the same
// run.
func BenchmarkParseLoadMetrics(b *testing.B) {
	page := vllmPage()
	b.Run("parse", func(b *testing.B) {
		b.SetBytes(int64(len(page)))
		b.ReportAllocs()
		for b.Loop() {
			if _, ok, err := parseLoadMetrics(bytes.NewReader(page)); !ok || err != nil {
				b.Fatal(ok, err)
			}
		}
	})
	b.Run("lines-only", func(b *testing.B) {
		b.SetBytes(int64(len(page)))
		b.ReportAllocs()
		for b.Loop() {
			sc := bufio.NewScanner(bytes.NewReader(page))
			sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
			n := 0
			for sc.Scan() {
				n += len(sc.Bytes())
			}
			if n == 0 {
				b.Fatal("no lines")
			}
		}
	})
}

// BenchmarkScrapeRead: one whole read as serve's scraper makes it (HTTP
// GET over a loopback socket with a kept-alive connection, the page
// parsed), against the same GET with the body discarded unparsed
// (get-only), the page served by an HTTP server in the same process: the
// cpu-ns/op metric (the process's CPU over the loop per read) is the
// client's and the server's together, an upper bound of serve's share.
func BenchmarkScrapeRead(b *testing.B) {
	page := vllmPage()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; version=0.0.4")
		w.Write(page)
	}))
	defer srv.Close()
	sc := newScraper(config.ScrapeSettings{}, func(string) bool { return true }, nil, metrics.NewSet(), b.Logf)
	defer sc.transport.CloseIdleConnections()
	url := srv.URL + "/metrics"
	for _, c := range []struct {
		name string
		read func() error
	}{
		{"read", func() error { _, err := sc.read(context.Background(), url); return err }},
		{"get-only", func() error {
			resp, err := sc.client.Get(url)
			if err != nil {
				return err
			}
			defer resp.Body.Close()
			_, err = io.Copy(io.Discard, resp.Body)
			return err
		}},
	} {
		b.Run(c.name, func(b *testing.B) {
			b.SetBytes(int64(len(page)))
			b.ReportAllocs()
			cpu0 := testkit.ProcessCPU()
			for b.Loop() {
				if err := c.read(); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(testkit.ProcessCPU()-cpu0)/float64(b.N), "cpu-ns/op")
		})
	}
}
