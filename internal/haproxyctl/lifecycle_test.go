package haproxyctl_test

import (
	"testing"

	"github.com/fleetwatch/fleetwatch/feed/feedtest"
	"github.com/fleetwatch/fleetwatch/internal/haproxyctl"
	"github.com/fleetwatch/fleetwatch/internal/testkit"
)

func TestControllerLifecycle(t *testing.T) {
	url, _ := feedtest.NewServer(t, feedtest.WithoutJetStream())
	nc := feedtest.Connect(t, url)
	testkit.CheckLifecycle(t, func(t *testing.T) testkit.Lifecycle {
		// No snapshot is published: the Runtime is never dialled.
		c, err := haproxyctl.NewController(nc, haproxyctl.ControllerSettings{
			Runtime: &haproxyctl.Runtime{Network: "tcp", Addr: "127.0.0.1:1"},
		})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return testkit.Lifecycle{Run: c.Run, Close: c.Close}
	}, haproxyctl.ErrRunning, haproxyctl.ErrClosed)
}
