package promlabel

import "testing"

func TestQuote(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"", `""`},
		{"vllm-a", `"vllm-a"`},
		{"http://10.0.0.1:8000/v1", `"http://10.0.0.1:8000/v1"`},
		{`a"b`, `"a\"b"`},
		{`a\b`, `"a\\b"`},
		{"a\nb", `"a\nb"`},
		{"tab\there", "\"tab\there\""}, // a tab is legal inside a label value as is
		{"é✓", `"é✓"`},                 // UTF-8 passes through untouched
	} {
		if got := Quote(tc.in); got != tc.want {
			t.Errorf("Quote(%q) = %s, want %s", tc.in, got, tc.want)
		}
	}
}
