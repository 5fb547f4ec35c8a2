package toylm

import (
	"bytes"
	"context"
	"errors"
	"math"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestUpperBound95(t *testing.T) {
	tests := []struct {
		name string
		k, n int
		want float64
		tol  float64 // relative
	}{
		// 1 - 0.05^(1/30000): the "about 30,000 event-free cycles" of 1e-4
		{"none in 30,000", 0, 30000, 9.98528e-5, 1e-5},
		{"none in 10", 0, 10, 0.258866, 1e-5},
		// (1-p)^10 + 10p(1-p)^9 = 0.05
		{"one in 10", 1, 10, 0.394163, 1e-5},
		// P(X <= k) = 0.05 solved with exact binomial sums in Python
		{"two in 2000", 2, 2000, 0.00314452, 1e-5},
		{"three in 30,000", 3, 30000, 0.000258435, 1e-5},
		{"all", 5, 5, 1, 0},
		{"no trials", 0, 0, 1, 0},
	}
	for _, tt := range tests {
		got := UpperBound95(tt.k, tt.n)
		if math.Abs(got-tt.want) > tt.tol*tt.want {
			t.Errorf("%s: UpperBound95(%d, %d) = %.6g, want %.6g", tt.name, tt.k, tt.n, got, tt.want)
		}
		if tt.k < tt.n {
			if p := binomCDF(tt.k, tt.n, got); math.Abs(p-0.05) > 1e-6 {
				t.Errorf("%s: P(X <= %d) at the bound is %.6g, want 0.05", tt.name, tt.k, p)
			}
		}
	}
	for k := range 5 {
		if a, b := UpperBound95(k, 30000), UpperBound95(k+1, 30000); a >= b {
			t.Errorf("bound of %d events (%g) not below that of %d (%g)", k, a, k+1, b)
		}
	}
}

// binomCDF is P(X <= k) for X ~ Binomial(n, p), summed in log space: an
// independent check of the bound's definition.
func binomCDF(k, n int, p float64) float64 {
	lp, lq := math.Log(p), math.Log1p(-p)
	ln, _ := math.Lgamma(float64(n + 1))
	sum := 0.0
	for i := 0; i <= k; i++ {
		li, _ := math.Lgamma(float64(i + 1))
		lr, _ := math.Lgamma(float64(n - i + 1))
		sum += math.Exp(ln - li - lr + float64(i)*lp + float64(n-i)*lq)
	}
	return sum
}

func TestVerdict(t *testing.T) {
	if got := verdict(0, 30000, CUSUMTarget); got != "within" {
		t.Errorf("0 in 30,000 against 1e-4: %q, want within", got)
	}
	if got, want := verdict(0, 2000, CUSUMTarget), "above: 0.0015, 15.0x the target"; got != want {
		t.Errorf("0 in 2000 against 1e-4: %q, want %q", got, want)
	}
}

// TestNullWorkersDoNotChangeTheResult runs the same seeded null cells one
// backend at a time and two at once.
func TestNullWorkersDoNotChangeTheResult(t *testing.T) {
	t.Parallel()
	h, _ := testHarness(t)
	h.Enrol, h.EnrolMin = 3, -1
	one, err := h.Null(LoadRegime, nil, 3, 6, 21)
	if err != nil {
		t.Fatal(err)
	}
	h.Workers = 2
	two, err := h.Null(LoadRegime, nil, 3, 6, 21)
	if err != nil {
		t.Fatal(err)
	}
	if one.Cycles != 18 {
		t.Errorf("%d cycles, want 18", one.Cycles)
	}
	if diff := cmp.Diff(one, two); diff != "" {
		t.Errorf("Null with 2 workers differs (-1 worker +2 workers):\n%s", diff)
	}
}

func TestWriteFalseAlarms(t *testing.T) {
	statistical(t)
	t.Parallel()
	var out bytes.Buffer
	err := WriteFalseAlarms(t.Context(), &out, ReportSettings{Cycles: 6, Backends: 2, Enrol: 3, Seed: 22, Workers: 2})
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"2 backends of 3 judged cycles per level, 2 at once",
		"| 0.003 | 6 | 0 (0 <= 0.393) |",
		"| 0.03 | 6 |",
		"| 0.1 | 6 |",
		"| load | 6 |",
		"| all levels | 24 | 0 (0 <= 0.117) | 0 (0 <= 0.117) | 0 (0 <= 0.117) | 0 (0 <= 0.117) | above: 0.117, 117.3x the target | above: 0.117, 1173.5x the target |",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if err := WriteFalseAlarms(ctx, &out, ReportSettings{Cycles: 6, Backends: 2, Enrol: 3}); !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled: %v, want context.Canceled", err)
	}
}
