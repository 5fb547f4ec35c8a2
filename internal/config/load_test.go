package config

import (
	"errors"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func TestLoadKeysErrors(t *testing.T) {
	for _, tt := range []struct {
		name, yaml, wantKey string
		wantLine            int
	}{
		{"bad orca", "pools:\n  - id: a\n    orca: binary\n", "pools[0].orca", 3},
		{"auto without url", "pools:\n  - id: a\n    backends:\n      - id: b\n        metrics_url: auto\n", "pools[0].backends[0].metrics_url", 5},
		{"bad metrics url", "pools:\n  - id: a\n    backends:\n      - id: b\n        metrics_url: ftp://x/metrics\n", "pools[0].backends[0].metrics_url", 5},
		{"scrape too often", "scrape:\n  interval: 49ms\n", "scrape.interval", 2},
		{"zero timeout", "scrape:\n  timeout: 0s\n", "scrape.timeout", 2},
		{"zero load_max_age", "analyzer:\n  load_max_age: 0s\n", "analyzer.load_max_age", 2},
		{"negative load_max_age", "pools:\n  - id: a\n    analyzer:\n      load_max_age: -1s\n", "pools[0].analyzer.load_max_age", 4},
	} {
		_, err := Parse([]byte(tt.yaml), "fw.yaml")
		var ce *Error
		if !errors.As(err, &ce) || ce.Key != tt.wantKey || ce.Line != tt.wantLine {
			t.Errorf("%s: err = %v, want key %s line %d", tt.name, err, tt.wantKey, tt.wantLine)
		}
	}
}

// TestScrapeIntervalMinimum: the shortest interval, MinScrapeInterval, is
// taken as written (the key errors above refuse a millisecond less).
func TestScrapeIntervalMinimum(t *testing.T) {
	cfg, err := Parse([]byte("scrape:\n  interval: 50ms\n"), "fw.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if got := cfg.ScrapeSettings().Interval; got != 50*time.Millisecond {
		t.Errorf("interval = %v, want 50ms", got)
	}
}

func TestScrapeSettings(t *testing.T) {
	cfg, err := Parse([]byte(`scrape:
  interval: 2s
  timeout: 300ms
pools:
  - id: p
    backends:
      - id: a
        url: https://gpu-a:8000/v1
        metrics_url: auto
      - id: b
        url: http://gpu-b:8000
        metrics_url: http://gpu-b:9090/custom/metrics
      - id: c
        url: http://gpu-c:8000
`), "fw.yaml")
	if err != nil {
		t.Fatal(err)
	}
	want := ScrapeSettings{Interval: 2 * time.Second, Timeout: 300 * time.Millisecond, Targets: []ScrapeTarget{
		{Pool: "p", Backend: "a", URL: "https://gpu-a:8000/metrics"},
		{Pool: "p", Backend: "b", URL: "http://gpu-b:9090/custom/metrics"},
	}}
	if diff := cmp.Diff(want, cfg.ScrapeSettings()); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
}
