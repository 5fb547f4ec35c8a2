package fleetwatch

import "testing"

func TestOutcomeFromStatus(t *testing.T) {
	tests := []struct {
		status int
		want   Outcome
	}{
		{200, OutcomeOK},
		{204, OutcomeOK},
		{299, OutcomeOK},
		{429, OutcomeThrottled},
		{408, OutcomeTimeout},
		{504, OutcomeTimeout},
		{0, OutcomeTimeout},
		{499, OutcomeCanceled},
		{400, OutcomeClientError},
		{404, OutcomeClientError},
		{500, OutcomeError},
		{503, OutcomeError},
		{302, OutcomeError},
		{600, OutcomeError},
		{100, OutcomeError},
		{199, OutcomeError},
		{300, OutcomeError},
		{-1, OutcomeError},
	}
	for _, tt := range tests {
		if got := OutcomeFromStatus(tt.status); got != tt.want {
			t.Errorf("OutcomeFromStatus(%d) = %v, want %v", tt.status, got, tt.want)
		}
	}
}

func TestOutcomeNames(t *testing.T) {
	tests := []struct {
		o              Outcome
		name           string
		failure, count bool
	}{
		{OutcomeOK, "ok", false, true},
		{OutcomeError, "error", true, true},
		{OutcomeThrottled, "throttled", false, true},
		{OutcomeTimeout, "timeout", true, true},
		{OutcomeCanceled, "canceled", false, false},
		{OutcomeClientError, "client_error", false, false},
		{OutcomeStalled, "stalled", true, true},
	}
	if len(tests) != NumOutcomes-1 {
		t.Fatalf("table has %d outcomes, the package %d", len(tests), NumOutcomes-1)
	}
	for _, tt := range tests {
		if got := tt.o.String(); got != tt.name {
			t.Errorf("Outcome(%d).String() = %q, want %q", tt.o, got, tt.name)
		}
		if got, ok := ParseOutcome(tt.name); !ok || got != tt.o {
			t.Errorf("ParseOutcome(%q) = %v, %v; want %v, true", tt.name, got, ok, tt.o)
		}
		if got := tt.o.IsFailure(); got != tt.failure {
			t.Errorf("%v.IsFailure() = %v, want %v", tt.o, got, tt.failure)
		}
		if got := tt.o.Counted(); got != tt.count {
			t.Errorf("%v.Counted() = %v, want %v", tt.o, got, tt.count)
		}
	}
	for _, s := range []string{"", "OK", "success", "client-error", "timeout "} {
		if o, ok := ParseOutcome(s); ok {
			t.Errorf("ParseOutcome(%q) = %v, true; want false", s, o)
		}
	}
	for _, o := range []Outcome{OutcomeUnset, numOutcomes, 255} {
		if s := o.String(); s != "" {
			t.Errorf("Outcome(%d).String() = %q, want empty", o, s)
		}
	}
}
