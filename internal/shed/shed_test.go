package shed

import (
	"strings"
	"testing"
)

func TestReason(t *testing.T) {
	h := func(kv ...string) func(string) string {
		return func(k string) string {
			for i := 0; i < len(kv); i += 2 {
				if strings.EqualFold(kv[i], k) {
					return kv[i+1]
				}
			}
			return ""
		}
	}
	long := strings.Repeat("é", 40) // 80 bytes
	for _, c := range []struct {
		status int
		header func(string) string
		want   string
	}{
		{429, h(DroppedReason, "queue_full"), "queue_full"},
		{503, h(DroppedReason, " saturated "), "saturated"},
		{503, h(Fleetwatch, "no_endpoint"), "no_endpoint"},
		{500, h(DroppedReason, "queue_full"), ""}, // a 500 is the backend's
		{429, h(), ""}, // a backend's own 429
		{529, h(), "overloaded_529"},
		{200, h(DroppedReason, "x"), ""},
		{429, h(DroppedReason, "a\x00b\nc"), "abc"},
		{429, h(DroppedReason, long), strings.Repeat("é", 32)},
	} {
		if got := Reason(c.status, c.header); got != c.want {
			t.Errorf("Reason(%d) = %q, want %q", c.status, got, c.want)
		}
	}
}
