package sim

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
)

// This file is what `fleetwatch sim` does with the scenarios: choose them by
// name, run every (scenario, policy, seed) in parallel, and write the
// results as CSV, Markdown and SVG files.

// SelectScenarios returns the scenarios named in names (comma-separated,
// in that order), or all when names is empty. The error for a name that is
// not a scenario is meant for the command line's user.
func SelectScenarios(all []Scenario, names string) ([]Scenario, error) {
	if names == "" {
		return all, nil
	}
	var out []Scenario
	for _, name := range strings.Split(names, ",") {
		sc, ok := ScenarioByName(strings.TrimSpace(name))
		if !ok {
			return nil, fmt.Errorf("unknown scenario %q (fleetwatch sim --scenario list)", name)
		}
		out = append(out, sc)
	}
	return out, nil
}

// RunScenarios runs every (scenario, policy, seed) on GOMAXPROCS workers and
// returns results[scenario][policy][seed], the policies being PoliciesOf
// the scenario and the seeds seed, seed+1, ... (seeds of them). Each run is
// deterministic, so the schedule does not change the results. It returns
// the first run's error, or ctx's error when ctx ends first.
func RunScenarios(ctx context.Context, scenarios []Scenario, seed uint64, seeds int) ([][][]*Result, error) {
	type job struct{ s, p, k int }
	results := make([][][]*Result, len(scenarios))
	var jobs []job
	for s, sc := range scenarios {
		pols := PoliciesOf(sc)
		results[s] = make([][]*Result, len(pols))
		for p := range pols {
			results[s][p] = make([]*Result, seeds)
			for k := range seeds {
				jobs = append(jobs, job{s, p, k})
			}
		}
	}
	var (
		mu    sync.Mutex // guards first, next and results
		first error
		next  int
		wg    sync.WaitGroup
	)
	for range runtime.GOMAXPROCS(0) {
		wg.Go(func() { // exits when the jobs run out, on the first error or when ctx ends
			for {
				mu.Lock()
				if next >= len(jobs) || first != nil || ctx.Err() != nil {
					mu.Unlock()
					return
				}
				j := jobs[next]
				next++
				mu.Unlock()
				sc := scenarios[j.s]
				r, err := Run(sc, PoliciesOf(sc)[j.p], seed+uint64(j.k))
				mu.Lock()
				if err != nil && first == nil {
					first = err
				}
				results[j.s][j.p][j.k] = r
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if first != nil {
		return nil, first
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	return results, nil
}

// CountRuns returns the number of runs in results (as RunScenarios returns
// them).
func CountRuns(results [][][]*Result) int {
	n := 0
	for _, s := range results {
		for _, p := range s {
			n += len(p)
		}
	}
	return n
}

// WriteFiles writes into dir (created if needed) results.csv (every run),
// tables.md (tables, the Markdown tables already written), and per
// scenario shares-<name>.csv, <name>-share.svg and <name>-ttft.svg (of the
// first seed). results is as RunScenarios returns it for scenarios.
func WriteFiles(dir string, scenarios []Scenario, results [][][]*Result, tables string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	write := func(name string, fill func(io.Writer) error) error {
		f, err := os.Create(filepath.Join(dir, name))
		if err != nil {
			return err
		}
		if err := fill(f); err != nil {
			f.Close()
			return fmt.Errorf("%s: %w", name, err)
		}
		return f.Close()
	}
	var flat []*Result
	for _, s := range results {
		for _, p := range s {
			flat = append(flat, p...)
		}
	}
	if err := write("results.csv", func(w io.Writer) error { return WriteCSV(w, flat, true) }); err != nil {
		return err
	}
	if err := write("tables.md", func(w io.Writer) error { _, err := io.WriteString(w, tables); return err }); err != nil {
		return err
	}
	var errs []error
	for i, sc := range scenarios {
		var firsts []*Result
		for _, runs := range results[i] {
			firsts = append(firsts, runs[0])
		}
		errs = append(errs,
			write("shares-"+sc.Name+".csv", func(w io.Writer) error { return WriteSharesCSV(w, firsts) }),
			write(sc.Name+"-share.svg", func(w io.Writer) error { return WriteShareSVG(w, sc, firsts) }),
			write(sc.Name+"-ttft.svg", func(w io.Writer) error { return WriteTTFTSVG(w, sc, firsts) }),
		)
	}
	return errors.Join(errs...)
}
