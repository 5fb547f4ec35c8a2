package toylm

import "testing"

func TestReportFormatting(t *testing.T) {
	tests := []struct {
		name, got, want string
	}{
		{"rate of none", rateCP(0, 4), "0 [0, 0.6]"},
		{"rate of all", rateCP(4, 4), "1 [0.4, 1]"},
		{"proportion of one", propCP(1, 1), "1/1 [0.03, 1.00]"},
		{"proportion of half", propCP(5, 10), "5/10 [0.19, 0.81]"},
		{"median delay", medianDelay([]int{3, 1, 2}), "2"},
		{"median delay, misses count as infinite", medianDelay([]int{0, 0, 1}), "not detected"},
		{"median delay, lower median", medianDelay([]int{4, 0, 1, 2}), "2"},
	}
	for _, tt := range tests {
		if tt.got != tt.want {
			t.Errorf("%s: got %q, want %q", tt.name, tt.got, tt.want)
		}
	}
}

func TestMedianOf(t *testing.T) {
	tests := []struct {
		in   []float64
		want float64
	}{
		{nil, 0},
		{[]float64{0.5}, 0.5},
		{[]float64{3, 1, 2}, 2},
		{[]float64{4, 3, 1, 2}, 2},
	}
	for _, tt := range tests {
		in := append([]float64(nil), tt.in...)
		if got := medianOf(tt.in); got != tt.want {
			t.Errorf("medianOf(%v) = %v, want %v", tt.in, got, tt.want)
		}
		for i := range in {
			if in[i] != tt.in[i] {
				t.Errorf("medianOf sorted its argument: %v", tt.in)
			}
		}
	}
}

func TestVariantModel(t *testing.T) {
	statistical(t)
	ref := New(Config{})
	plain := 0
	for _, v := range variantsOnce() { // calibrated from New(Config{}) once for the package's tests
		m, ok := variantModel(v, ref)
		if v.Name == "partial-q4-50%" {
			if ok {
				t.Errorf("%s has a single model", v.Name)
			}
			continue
		}
		if !ok || m == nil {
			t.Errorf("%s: no single model", v.Name)
		}
		plain++
	}
	if plain != 5 {
		t.Errorf("%d plain variants, want 5", plain)
	}
}
