package toylm

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"time"

	fleetwatch "github.com/fleetwatch/fleetwatch"
	"github.com/fleetwatch/fleetwatch/internal/fakeai"
	"github.com/fleetwatch/fleetwatch/probes/drift"
)

// The tool-call tier's harness: tool answers come from fakeai.ToolModel
// (the fake backend's own function-calling model) and are judged by
// drift.JudgeTool, cycle after cycle, through drift.Monitor, the code
// serve runs. The text prompts of the suite are answered by the noiseless
// reference, so that only the tool tier can move.

// ToolReference is the reference tool artefact of the harness: 15% of the
// prompts are hard for it, and a hard prompt is answered wrongly half the
// time, so that its baseline is not a perfect 100% and every cycle has
// sampling noise.
var ToolReference = fakeai.ToolSettings{Artefact: 1, Hard: 0.15, HardError: 0.5}

// ToolReferenceIID fails every prompt independently with probability
// 0.0625 (about ToolReference's mean rate): the binomial test's own null,
// whose failures are spread over all prompts and vary the most from cycle
// to cycle.
var ToolReferenceIID = fakeai.ToolSettings{Artefact: 1, Hard: 1, HardError: 0.0625}

// ToolHarness runs the tool tier of a suite with tool probes.
type ToolHarness struct {
	Harness // Suite must have Tools
	// Tool is the reference tool artefact. If zero, ToolReference.
	Tool fakeai.ToolSettings

	text     []drift.Observation  // the noiseless reference's answers
	requests []fakeai.ToolRequest // per tool prompt
}

// ToolOnlySuite is s with its first text prompt only: the tool harness's
// suite, whose text part (answered the same every cycle) costs little at
// enrolment.
func ToolOnlySuite(s *drift.Suite) *drift.Suite {
	out := *s
	out.Prompts = s.Prompts[:1]
	return &out
}

func (h *ToolHarness) tool() fakeai.ToolSettings {
	if h.Tool.Artefact == 0 && h.Tool.Hard == 0 && h.Tool.HardError == 0 && h.Tool.Break == 0 {
		return ToolReference
	}
	return h.Tool
}

// ToolRequest is the fake backend's view of the suite's tools: what a
// request built by probes.ToolRequestBody carries.
func ToolRequest(t *drift.ToolSuite, i int) fakeai.ToolRequest {
	tr := fakeai.ToolRequest{Choice: t.Prompts[i].ToolChoice}
	if tr.Choice == "" {
		tr.Choice = drift.ToolChoiceAuto
	}
	for _, f := range t.Functions {
		var params map[string]any
		_ = json.Unmarshal(f.Parameters, &params) // validated by the suite
		tr.Tools = append(tr.Tools, fakeai.ToolSpec{Name: f.Name, Description: f.Description, Parameters: params})
	}
	return tr
}

// ToolCycle is one cycle of the suite: the text answers given, the tool
// prompts answered by m and judged; requests are ToolRequest of each tool
// prompt.
func ToolCycle(s *drift.Suite, text []drift.Observation, requests []fakeai.ToolRequest, m *fakeai.ToolModel, at time.Time) *drift.Cycle {
	cy := &drift.Cycle{At: at, Obs: text}
	for i, p := range s.Tools.Prompts {
		var calls []drift.ToolCall
		for _, c := range m.Answer("user: "+p.Text, requests[i]) {
			calls = append(calls, drift.ToolCall{Name: c.Name, Arguments: c.Arguments})
		}
		cy.Tools = append(cy.Tools, drift.JudgeTool(s.Tools, i, calls, false))
	}
	return cy
}

// cycle is ToolCycle of m at cycle index i.
func (h *ToolHarness) cycle(m *fakeai.ToolModel, i int) *drift.Cycle {
	if h.text == nil {
		h.text = Cycle(h.Suite, h.ref(), epoch).Obs
		for k := range h.Suite.Tools.Prompts {
			h.requests = append(h.requests, ToolRequest(h.Suite.Tools, k))
		}
	}
	return ToolCycle(h.Suite, h.text, h.requests, m, h.at(i))
}

// ExpectedValidRate is the reference artefact's expected valid-call rate
// over the suite's should-call prompts (1 - HardError on its hard ones).
func (h *ToolHarness) ExpectedValidRate() float64 {
	t := h.tool()
	m, _ := t.Model()
	n, sum := 0, 0.0
	for _, p := range h.Suite.Tools.Prompts {
		if p.Expect == "" {
			continue
		}
		n++
		if m.IsHard("user: " + p.Text) {
			sum += 1 - t.HardError
		} else {
			sum++
		}
	}
	return sum / float64(n)
}

// toolEnrol runs enrolment cycles of the reference until m has a baseline
// and returns the next cycle index.
func (h *ToolHarness) toolEnrol(m *drift.Monitor, tm *fakeai.ToolModel) (int, error) {
	for i := 0; ; i++ {
		r, err := m.Observe(h.cycle(tm, i), nil)
		if err != nil {
			return 0, err
		}
		if r.Enrolled {
			return i + 1, nil
		}
	}
}

func (h *ToolHarness) model(seed uint64, brk float64, modes []string) *fakeai.ToolModel {
	t := h.tool()
	t.Seed, t.Break, t.Modes = seed, brk, modes
	m, err := t.Model()
	if err != nil {
		panic(err) // the harness's own settings
	}
	return m
}

// ToolNull runs backends independent enrolments of the reference tool
// artefact, then cycles cycles each of the same artefact, and counts the
// false alarms.
func (h *ToolHarness) ToolNull(backends, cycles int, seed uint64) (NullResult, error) {
	res := NullResult{Backends: backends, Variant: "tools reference"}
	for k := range backends {
		tm := h.model(seed*1000003+uint64(k), 0, nil)
		m := h.monitor(fmt.Sprint("tool-null-", k))
		start, err := h.toolEnrol(m, tm)
		if err != nil {
			return res, err
		}
		for i := range cycles {
			r, err := m.Observe(h.cycle(tm, start+i), nil)
			if err != nil {
				return res, err
			}
			res.Cycles++
			if r.Tools != nil && r.Signal.Gross {
				res.Gross++
			}
			if tr := r.Transition; tr != nil && tr.From == fleetwatch.DriftOK {
				res.Alarms++
			}
			if tr := r.Transition; tr != nil && tr.To == fleetwatch.DriftDrifted {
				res.Drifted++
			}
		}
	}
	return res, nil
}

// ToolPower enrols the reference tool artefact, then breaks a share of its
// calls so that the expected valid-call rate falls by fall (0.2: 20
// points), by the given modes (nil: all), and runs up to maxCycles cycles
// per trial.
func (h *ToolHarness) ToolPower(fall float64, modes []string, trials, maxCycles int, seed uint64) (PowerResult, error) {
	res := PowerResult{Variant: fmt.Sprintf("valid-call rate -%.0f points", 100*fall), Trials: trials}
	brk := min(fall/h.ExpectedValidRate(), 1)
	for k := range trials {
		s := seed*7919 + uint64(k)
		tm := h.model(s, 0, nil)
		m := h.monitor(fmt.Sprint("tool-power-", k))
		start, err := h.toolEnrol(m, tm)
		if err != nil {
			return res, err
		}
		broken := h.model(s^0xb4ea, brk, modes)
		sus, dr, err := delays(maxCycles, func(i int) (drift.Result, error) {
			return m.Observe(h.cycle(broken, start+i), nil)
		})
		if err != nil {
			return res, err
		}
		res.SuspectDelay = append(res.SuspectDelay, sus)
		res.DriftedDelay = append(res.DriftedDelay, dr)
	}
	return res, nil
}

// ToolPeers enrols n backends, the last of which breaks a share of its
// calls from the start (a fall of fall in the valid-call rate), and
// compares their tool baselines.
func (h *ToolHarness) ToolPeers(fall float64, n, trials int, seed uint64) (named, wrong int, err error) {
	brk := min(fall/h.ExpectedValidRate(), 1)
	for k := range trials {
		baselines := map[string]*drift.Baseline{}
		for i := range n {
			b := 0.0
			if i == n-1 {
				b = brk
			}
			tm := h.model(seed*104729+uint64(k*n+i), b, nil)
			id := fmt.Sprintf("b%d", i)
			m := h.monitor(id)
			if _, err := h.toolEnrol(m, tm); err != nil {
				return named, wrong, err
			}
			baselines[id] = m.Baseline()
		}
		v := drift.CompareToolPeers(baselines, h.Params)
		switch v.Outlier {
		case fmt.Sprintf("b%d", n-1):
			named++
		case "":
		default:
			wrong++
		}
	}
	return named, wrong, nil
}

// ToolReportSettings configure WriteToolReport. Zero fields take the
// defaults of ReportSettings.
type ToolReportSettings = ReportSettings

// WriteToolReport runs the tool tier's harness over default-v1+tools-v1 and
// writes its Markdown section: the reference's rates, false alarms on
// unchanged backends, power and delay against falls of the valid-call rate
// (by every break mode, and by each one), and peers.
func WriteToolReport(ctx context.Context, w io.Writer, s ToolReportSettings) error {
	s = s.withDefaults()
	suite, err := drift.LoadSuite("default-v1+tools-v1")
	if err != nil {
		return err
	}
	h := &ToolHarness{Harness: Harness{Suite: ToolOnlySuite(suite), Enrol: s.Enrol, EnrolMin: s.EnrolMin, Interval: s.Interval, Ref: New(Config{})}}
	if s.EnrolMin == 0 {
		h.EnrolMin = -1
	}
	calls := 0
	for _, p := range suite.Tools.Prompts {
		if p.Expect != "" {
			calls++
		}
	}
	p := drift.DefaultToolParams()
	fmt.Fprintf(w, "\n## Tool-call probes (suite %s: %d tool prompts, %d expecting a call; seed %d)\n\n", suite.Name, len(suite.Tools.Prompts), calls, s.Seed)
	iid := &ToolHarness{Harness: h.Harness, Tool: ToolReferenceIID}
	refs := []struct {
		name string
		h    *ToolHarness
	}{{"hard prompts", h}, {"iid failures", iid}}
	fmt.Fprintf(w, "Reference tool artefacts: \"hard prompts\" (%.0f%% of prompts hard, answered wrongly %.0f%% of the time each; expected valid-call rate %.3f) and \"iid failures\" (every prompt wrong with probability %.4f; expected valid-call rate %.3f). Thresholds: gross at a fall of >= %.0f points with z >= %.2f; CUSUM h %.0f, mean fall >= %.0f points; baseline failure rate floored at %.2f.\n",
		100*ToolReference.Hard, 100*ToolReference.HardError, h.ExpectedValidRate(), ToolReferenceIID.HardError, iid.ExpectedValidRate(),
		100*p.GrossPoints, p.GrossZ, p.CUSUMThreshold, 100*p.MinFall, p.MinFailure)
	fmt.Fprintln(w, "\n| reference | served | cycles | gross signals | rate (95% CP) | alarms (left ok) | rate (95% CP) | drifted |")
	fmt.Fprintln(w, "|---|---|---|---|---|---|---|---|")
	per := s.Cycles / s.Backends
	for _, ref := range refs {
		if err := ctx.Err(); err != nil {
			return err
		}
		r, err := ref.h.ToolNull(s.Backends, per, s.Seed)
		if err != nil {
			return err
		}
		fmt.Fprintf(w, "| %s | unchanged | %d | %d | %s | %d | %s | %d |\n", ref.name, r.Cycles, r.Gross, rateCP(r.Gross, r.Cycles), r.Alarms, rateCP(r.Alarms, r.Cycles), r.Drifted)
	}
	fmt.Fprintf(w, "\nPower and delay (%d trials per row; the calls break right after enrolment; the rows of one reference and fall share their draws, so the break modes differ only in how a call is wrong):\n\n", s.Trials)
	fmt.Fprintf(w, "| reference | valid-call rate falls by | broken by | left ok in 1 cycle (95%% CP) | within 2 | within 3 | drifted within %d | median cycles to alarm | median cycles to drifted |\n", s.MaxDelay)
	fmt.Fprintln(w, "|---|---|---|---|---|---|---|---|---|")
	type row struct {
		ref   int
		fall  float64
		modes []string
	}
	rows := []row{{0, 0.1, nil}, {0, 0.2, nil}, {0, 0.3, nil}}
	for _, m := range fakeai.BreakModes {
		rows = append(rows, row{0, 0.2, []string{m}})
	}
	rows = append(rows, row{1, 0.1, nil}, row{1, 0.2, nil}, row{1, 0.3, nil})
	for _, rw := range rows {
		if err := ctx.Err(); err != nil {
			return err
		}
		pr, err := refs[rw.ref].h.ToolPower(rw.fall, rw.modes, s.Trials, s.MaxDelay, s.Seed)
		if err != nil {
			return err
		}
		by := "every mode"
		if rw.modes != nil {
			by = rw.modes[0]
		}
		fmt.Fprintf(w, "| %s | %.0f points | %s | %s | %s | %s | %s | %s | %s |\n", refs[rw.ref].name, 100*rw.fall, by,
			propCP(pr.Within(1), pr.Trials), propCP(pr.Within(2), pr.Trials), propCP(pr.Within(3), pr.Trials),
			propCP(pr.DriftedWithin(s.MaxDelay), pr.Trials), medianDelay(pr.SuspectDelay), medianDelay(pr.DriftedDelay))
	}
	fmt.Fprintf(w, "\nPeers (3 backends, the last one breaking its calls from the start; %d trials; named when its enrolment rates are >= %.0f points below the others' with z >= %.2f):\n\n", s.PeerTrials, 100*p.PeerPoints, p.GrossZ)
	fmt.Fprintln(w, "| valid-call rate lower by | outlier named (95% CP) | wrong backend named |")
	fmt.Fprintln(w, "|---|---|---|")
	for _, fall := range []float64{0, 0.1, 0.2, 0.3} {
		if err := ctx.Err(); err != nil {
			return err
		}
		named, wrong, err := h.ToolPeers(fall, 3, s.PeerTrials, s.Seed)
		if err != nil {
			return err
		}
		fmt.Fprintf(w, "| %.0f points | %s | %d |\n", 100*fall, propCP(named, s.PeerTrials), wrong)
	}
	return nil
}
