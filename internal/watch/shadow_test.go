package watch

import (
	"strings"
	"testing"
	"time"

	"github.com/fleetwatch/fleetwatch"
)

func TestRenderSnapshotShadow(t *testing.T) {
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	s := watchSnapshot(7, now)
	s.Shadow = fleetwatch.ShadowBreakers
	var b strings.Builder
	RenderSnapshot(&b, s, now)
	header := strings.SplitN(b.String(), "\n", 2)[0]
	if !strings.HasSuffix(header, "age 0s  SHADOW breakers (advisory: routers follow the breakers only, not the weights)") {
		t.Errorf("header of a snapshot in shadow mode: %q", header)
	}
}
