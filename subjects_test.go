package fleetwatch

import (
	"errors"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestSubjects(t *testing.T) {
	type names struct {
		Outcomes, OutcomesWildcard, Accepted, AcceptedWildcard, Rejects string
		Decisions, DecisionsWildcard, Drift, DriftWildcard, DriftReview string
		Control, StreamOutcomes, StreamDrift, BucketDecisions           string
		BucketBaselines                                                 string
	}
	of := func(s Subjects) names {
		return names{
			s.Outcomes(), s.OutcomesWildcard(), s.Accepted("llama"), s.AcceptedWildcard(), s.Rejects(),
			s.Decisions("meta-llama/Llama-3.1-70B-Instruct"), s.DecisionsWildcard(), s.Drift("llama"),
			s.DriftWildcard(), s.DriftReview(), s.Control("rebaseline"), s.StreamOutcomes(),
			s.StreamDrift(), s.BucketDecisions(), s.BucketBaselines(),
		}
	}
	tests := []struct {
		name string
		s    Subjects
		want names
	}{
		{"default prefix", Subjects{}, names{
			"fw.outcomes", "fw.outcomes.>", "fw.accepted.llama", "fw.accepted.>", "fw.rejects",
			"fw.decisions.meta-llama/Llama-3.1-70B-Instruct", "fw.decisions.>", "fw.drift.llama",
			"fw.drift.>", "fw.drift.review", "fw.control.rebaseline", "FW_OUTCOMES",
			"FW_DRIFT", "fw_decisions", "fw_probe_baselines",
		}},
		{"explicit default prefix", Subjects{Prefix: DefaultPrefix}, names{
			"fw.outcomes", "fw.outcomes.>", "fw.accepted.llama", "fw.accepted.>", "fw.rejects",
			"fw.decisions.meta-llama/Llama-3.1-70B-Instruct", "fw.decisions.>", "fw.drift.llama",
			"fw.drift.>", "fw.drift.review", "fw.control.rebaseline", "FW_OUTCOMES",
			"FW_DRIFT", "fw_decisions", "fw_probe_baselines",
		}},
		{"custom dotted prefix", Subjects{Prefix: "acme.fw"}, names{
			"acme.fw.outcomes", "acme.fw.outcomes.>", "acme.fw.accepted.llama", "acme.fw.accepted.>", "acme.fw.rejects",
			"acme.fw.decisions.meta-llama/Llama-3.1-70B-Instruct", "acme.fw.decisions.>", "acme.fw.drift.llama",
			"acme.fw.drift.>", "acme.fw.drift.review", "acme.fw.control.rebaseline", "ACME_FW_OUTCOMES",
			"ACME_FW_DRIFT", "acme_fw_decisions", "acme_fw_probe_baselines",
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if diff := cmp.Diff(tt.want, of(tt.s)); diff != "" {
				t.Errorf("names (-want +got):\n%s", diff)
			}
		})
	}
}

func TestSubjectsDecisionsPool(t *testing.T) {
	tests := []struct {
		prefix, subject string
		pool            string
		ok              bool
	}{
		{"", "fw.decisions.llama", "llama", true},
		{"", "fw.decisions.meta-llama/Llama-3.1-70B-Instruct", "meta-llama/Llama-3.1-70B-Instruct", true},
		{"", "fw.decisions.a.b", "a.b", true},
		{"", "fw.decisions.", "", false},
		{"", "fw.decisions", "", false},
		{"", "fw.drift.llama", "", false},
		{"", "acme.fw.decisions.llama", "", false},
		{"acme.fw", "acme.fw.decisions.llama", "llama", true},
		{"acme.fw", "fw.decisions.llama", "", false},
	}
	for _, tt := range tests {
		pool, ok := Subjects{Prefix: tt.prefix}.DecisionsPool(tt.subject)
		if pool != tt.pool || ok != tt.ok {
			t.Errorf("Subjects{%q}.DecisionsPool(%q) = %q, %v; want %q, %v", tt.prefix, tt.subject, pool, ok, tt.pool, tt.ok)
		}
	}
}

func TestValidatePrefix(t *testing.T) {
	for _, p := range []string{"fw", "acme.fw", "a-b_c.D9"} {
		if err := ValidatePrefix(p); err != nil {
			t.Errorf("ValidatePrefix(%q) = %v, want nil", p, err)
		}
	}
	for _, p := range []string{"", ".", "fw.", ".fw", "a..b", "f w", "fw.*", "fw.>", "fw/x"} {
		if err := ValidatePrefix(p); err == nil {
			t.Errorf("ValidatePrefix(%q) = nil, want an error", p)
		}
	}
}

func TestValidatePoolID(t *testing.T) {
	tests := []struct {
		id    string
		valid bool
	}{
		{"llama-3.1-70b", true},
		{"meta-llama/Llama-3.1-70B-Instruct", true},
		{"a", true},
		{"a.b", true},
		{"a=b_c-d/e", true},
		{"/", true},
		{strings.Repeat("a", 256), true},
		{"", false},
		{".a", false},
		{"a.", false},
		{".", false},
		{"a..b", false},
		{strings.Repeat("a", 257), false},
		{"a b", false},
		{"a*", false},
		{"a>", false},
		{"é", false},
		{"a\x00", false},
		{"a:b", false},
	}
	for _, tt := range tests {
		err := ValidatePoolID(tt.id)
		if tt.valid && err != nil {
			t.Errorf("ValidatePoolID(%.40q) = %v, want nil", tt.id, err)
		}
		if !tt.valid && !errors.Is(err, ErrInvalidPool) {
			t.Errorf("ValidatePoolID(%.40q) = %v, want ErrInvalidPool", tt.id, err)
		}
	}
}

func TestValidateBackendID(t *testing.T) {
	tests := []struct {
		id    string
		valid bool
	}{
		{"vllm-a", true},
		{"http://10.0.0.7:8000/v1", true},
		{"host:8000", true},
		{"gpu box é 😀", true},
		{strings.Repeat("a", 256), true},
		{"", false},
		{strings.Repeat("a", 257), false},
		{strings.Repeat("a", 300), false},
		{"a\nb", false},
		{"a\tb", false},
		{"\x00", false},
		{"a\x7f", false},
		{"a\xff", false},
	}
	for _, tt := range tests {
		err := ValidateBackendID(tt.id)
		if tt.valid && err != nil {
			t.Errorf("ValidateBackendID(%.40q) = %v, want nil", tt.id, err)
		}
		if !tt.valid && !errors.Is(err, ErrInvalidBackend) {
			t.Errorf("ValidateBackendID(%.40q) = %v, want ErrInvalidBackend", tt.id, err)
		}
	}
}

func TestSubjectsOutcomesFrom(t *testing.T) {
	for _, tc := range []struct {
		s      Subjects
		source string
		want   string
	}{
		{Subjects{}, "edge-1", "fw.outcomes.edge-1"},
		{Subjects{}, "edge 1.eu>*\t", "fw.outcomes.edge_1_eu___"},
		{Subjects{}, "", "fw.outcomes._"},
		{Subjects{Prefix: "acme.fw"}, "r/1", "acme.fw.outcomes.r/1"},
	} {
		got := tc.s.OutcomesFrom(tc.source)
		if got != tc.want {
			t.Errorf("%+v.OutcomesFrom(%q) = %q, want %q", tc.s, tc.source, got, tc.want)
		}
		if strings.Count(got, ".") != strings.Count(tc.s.Outcomes(), ".")+1 {
			t.Errorf("%q is not one token below %s", got, tc.s.Outcomes())
		}
	}
}
