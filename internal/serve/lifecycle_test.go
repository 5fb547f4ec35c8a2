package serve

import (
	"path/filepath"
	"sync"
	"testing"

	"github.com/fleetwatch/fleetwatch/feed/feedtest"
	"github.com/fleetwatch/fleetwatch/internal/testkit"
)

func TestServerLifecycle(t *testing.T) {
	url, _ := feedtest.NewServer(t)
	testkit.CheckLifecycle(t, func(t *testing.T) testkit.Lifecycle {
		ready := make(chan struct{})
		var once sync.Once
		r := newServer(t, "nats: {url: \""+url+"\"}\nprobes: {disabled: true}\n", filepath.Join(t.TempDir(), "data"),
			Options{OnReady: func() { once.Do(func() { close(ready) }) }})
		t.Cleanup(func() { r.Close() })
		return testkit.Lifecycle{Run: r.Run, Close: r.Close, Ready: ready, Once: true}
	}, ErrRunning, ErrClosed)
}
