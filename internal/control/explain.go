package control

import (
	"fmt"
	"io"
	"sort"
	"strings"
	"text/tabwriter"

	"github.com/fleetwatch/fleetwatch"
)

// Explained is `fleetwatch explain`'s view of serve's /api/explain answer
// (docs/OPERATIONS.md "Explain: why a backend is in its state"): the fields its text
// prints, under the JSON names serve gives them. serve's own type embeds
// the analyzer's Explanation, which this package may not import (DESIGN.md);
// the client reads the JSON like any other client, and
// internal/serve's TestExplainViewMatchesTheAnswer fails when a field here
// has no field of the same name and kind in serve's answer.
type Explained struct {
	Pool     string             `json:"pool"`
	Backends []ExplainedBackend `json:"backends"`
}

// ExplainedBackend is one backend of an Explained (analyzer.Explanation
// and its last transitions, as far as the text prints them).
type ExplainedBackend struct {
	Pool    string          `json:"pool"`
	Backend string          `json:"backend"`
	At      fleetwatch.Time `json:"at"`

	State      fleetwatch.State `json:"state"`
	Since      fleetwatch.Time  `json:"since"`
	Reason     string           `json:"reason"`
	Weight     float64          `json:"weight"`
	OpenUntil  fleetwatch.Time  `json:"open_until"`
	QuotaUntil fleetwatch.Time  `json:"quota_until"`
	Trips      int              `json:"trips"`

	Verdict       fleetwatch.State `json:"verdict"`
	VerdictCause  string           `json:"verdict_cause"`
	VerdictReason string           `json:"verdict_reason"`
	VerdictWeight float64          `json:"verdict_weight"`

	WindowMs int64             `json:"window_ms"`
	Counts   map[string]uint64 `json:"counts"`
	Requests uint64            `json:"requests"`
	Counted  uint64            `json:"counted"`
	Recent   struct {
		SpanMs   int64  `json:"span_ms"`
		Requests uint64 `json:"requests"`
		Counted  uint64 `json:"counted"`
	} `json:"recent"`

	Evaluated         bool                 `json:"evaluated"`
	MinRequests       int                  `json:"min_requests"`
	Rules             []ExplainedRule      `json:"rules"`
	CapHeld           string               `json:"cap_held"`
	HalfOpenOK        int                  `json:"half_open_ok"`
	HalfOpenSuccesses int                  `json:"half_open_successes"`
	WeightParts       ExplainedWeight      `json:"weight_parts"`
	Override          *fleetwatch.Override `json:"override"`
	Shadow            fleetwatch.Shadow    `json:"shadow"`

	// Transitions are the backend's last state changes, newest first.
	Transitions []ExplainedTransition `json:"transitions"`
}

// ExplainedRule is one trip rule against its threshold.
type ExplainedRule struct {
	Rule      string  `json:"rule"`
	Value     float64 `json:"value"`
	Threshold float64 `json:"threshold"`
	HasValue  bool    `json:"has_value"`
	Fires     bool    `json:"fires"`
	HeldBy    string  `json:"held_by"`
	Detail    string  `json:"detail"`
}

// ExplainedWeight is what sets or lowers the weight.
type ExplainedWeight struct {
	Fixed  string `json:"fixed"`
	Reason string `json:"reason"`
}

// ExplainedTransition is one state change with its reason.
type ExplainedTransition struct {
	At     fleetwatch.Time  `json:"at"`
	From   fleetwatch.State `json:"from"`
	To     fleetwatch.State `json:"to"`
	Cause  string           `json:"cause"`
	Reason string           `json:"reason"`
}

// WriteExplained writes an explanation for a terminal: per backend its
// state and reason, the verdict of an evaluation now, the window's counts,
// every rule against its threshold with what held it, the weight's parts
// and the last transitions (`fleetwatch explain`).
func WriteExplained(w io.Writer, ex Explained) error {
	var b strings.Builder
	for i, e := range ex.Backends {
		if i > 0 {
			b.WriteString("\n")
		}
		fmt.Fprintf(&b, "%s / %s: %s, weight %s", e.Pool, e.Backend, e.State, trimFloat(e.Weight))
		if !e.Since.IsZero() {
			fmt.Fprintf(&b, ", since %s", fleetwatch.FormatTime(e.Since.Time))
		}
		if !e.QuotaUntil.IsZero() {
			fmt.Fprintf(&b, ", out of quota until %s (not a trip: no probe before then)", fleetwatch.FormatTime(e.QuotaUntil.Time))
		} else if !e.OpenUntil.IsZero() {
			fmt.Fprintf(&b, ", open until %s (trip %d)", fleetwatch.FormatTime(e.OpenUntil.Time), e.Trips)
		}
		b.WriteString("\n")
		if o := e.Override; o != nil {
			w := ""
			if o.Weight != nil {
				w = " " + trimFloat(*o.Weight)
			}
			fmt.Fprintf(&b, "  override: %s%s by %s until %s: %s (snapshots publish the override; the rest is the analyzer's own view)\n",
				o.Kind, w, o.Who, fleetwatch.FormatTime(o.Until.Time), o.Reason)
		}
		if e.Shadow.On() {
			fmt.Fprintf(&b, "  shadow:  the pool is in shadow mode %s: this decision is advisory (docs/OPERATIONS.md \"Rolling out with shadow mode\")\n", e.Shadow)
		}
		if e.Reason != "" {
			fmt.Fprintf(&b, "  reason:  %s\n", e.Reason)
		}
		verdict := string(e.Verdict)
		if verdict == "" {
			verdict = "dropped"
		}
		fmt.Fprintf(&b, "  now:     an evaluation at %s leaves it %s with weight %s", fleetwatch.FormatTime(e.At.Time), verdict, trimFloat(e.VerdictWeight))
		if e.VerdictCause != "" {
			fmt.Fprintf(&b, " (%s: %s)", e.VerdictCause, e.VerdictReason)
		}
		b.WriteString("\n")
		var counts []string
		for o, n := range e.Counts {
			counts = append(counts, fmt.Sprintf("%s %d", o, n))
		}
		sort.Strings(counts)
		fmt.Fprintf(&b, "  window:  %dms, %d requests (%d counted): %s; newest %dms: %d requests (%d counted)\n",
			e.WindowMs, e.Requests, e.Counted, strings.Join(counts, ", "), e.Recent.SpanMs, e.Recent.Requests, e.Recent.Counted)
		switch {
		case e.State != fleetwatch.StateClosed:
			fmt.Fprintf(&b, "  gate:    applies once closed (%d of min_requests %d now)\n", e.Counted, e.MinRequests)
		case e.Evaluated:
			fmt.Fprintf(&b, "  gate:    evaluated (%d of min_requests %d)\n", e.Counted, e.MinRequests)
		default:
			fmt.Fprintf(&b, "  gate:    not evaluated: %d of %d requests (the rate rules cannot open it yet)\n", e.Counted, e.MinRequests)
		}
		if e.HalfOpenSuccesses > 0 {
			fmt.Fprintf(&b, "  probe:   %d of %d ok in a row while half-open\n", e.HalfOpenOK, e.HalfOpenSuccesses)
		}
		if e.CapHeld != "" {
			fmt.Fprintf(&b, "  cap:     %s\n", e.CapHeld)
		}
		b.WriteString("  rules:\n")
		tw := tabwriter.NewWriter(&b, 0, 4, 2, ' ', 0)
		for _, r := range e.Rules {
			value := "-"
			if r.HasValue {
				value = trimFloat(r.Value)
			}
			verdict := ""
			switch {
			case r.Fires && r.HeldBy != "":
				verdict = "fires, held by " + r.HeldBy
			case r.Fires:
				verdict = "FIRES"
			}
			fmt.Fprintf(tw, "    %s\t%s\t/ %s\t%s\t%s\n", r.Rule, value, trimFloat(r.Threshold), verdict, r.Detail)
		}
		tw.Flush()
		wp := e.WeightParts
		switch {
		case wp.Reason != "":
			fmt.Fprintf(&b, "  weight:  %s\n", wp.Reason)
		case wp.Fixed != "":
			fmt.Fprintf(&b, "  weight:  set by %s\n", wp.Fixed)
		default:
			b.WriteString("  weight:  nothing lowers it\n")
		}
		if len(e.Transitions) > 0 {
			b.WriteString("  transitions (newest first):\n")
			for _, t := range e.Transitions {
				fmt.Fprintf(&b, "    %s  %s -> %s  %s: %s\n", fleetwatch.FormatTime(t.At.Time), t.From, t.To, t.Cause, t.Reason)
			}
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// trimFloat formats a number with at most 4 decimals and no trailing zeros.
func trimFloat(v float64) string {
	s := strings.TrimRight(fmt.Sprintf("%.4f", v), "0")
	return strings.TrimSuffix(s, ".")
}
