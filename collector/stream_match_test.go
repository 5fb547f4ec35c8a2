package collector

import "testing"

func TestSubjectMatches(t *testing.T) {
	tests := []struct {
		pattern, subject string
		want             bool
	}{
		{"fw.partition.3", "fw.partition.3", true},
		{"fw.partition.3", "fw.partition.13", false},
		{"fw.partition.3", "fw.partition.3.x", false},
		{"fw.accepted.>", "fw.accepted.chat", true},
		{"fw.accepted.>", "fw.accepted.chat.x", true},
		{"fw.accepted.>", "fw.accepted", false},
		{"fw.*.chat", "fw.accepted.chat", true},
		{"fw.*.chat", "fw.accepted.other", false},
		{"fw.*", "fw.accepted.chat", false},
	}
	for _, tc := range tests {
		if got := subjectMatches(tc.pattern, tc.subject); got != tc.want {
			t.Errorf("subjectMatches(%q, %q) = %v, want %v", tc.pattern, tc.subject, got, tc.want)
		}
	}
}
