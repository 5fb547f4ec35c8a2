package collector

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/fleetwatch/fleetwatch/feed/feedtest"
)

// TestCapturePersistMode: a capture the collector creates on a single
// server persists asynchronously (persistMode's reasons); one that exists
// with the default mode is used as it is, without an update the server
// would refuse, so the rest of its configuration is still kept up to date.
func TestCapturePersistMode(t *testing.T) {
	for _, tc := range []struct {
		name     string
		existing *jetstream.PersistModeType
		want     jetstream.PersistModeType
	}{
		{"created", nil, jetstream.AsyncPersistMode},
		{"existing default", new(jetstream.DefaultPersistMode), jetstream.DefaultPersistMode},
	} {
		t.Run(tc.name, func(t *testing.T) {
			url, _ := feedtest.NewServer(t)
			nc := feedtest.Connect(t, url)
			js, err := jetstream.New(nc)
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if tc.existing != nil {
				if _, err := js.CreateStream(ctx, jetstream.StreamConfig{
					Name: "FW_CAPTURE", Subjects: []string{"fw.outcomes", "fw.outcomes.>"},
					Storage: jetstream.FileStorage, MaxAge: time.Minute, PersistMode: *tc.existing,
				}); err != nil {
					t.Fatal(err)
				}
			}
			var mu sync.Mutex
			var logs []string
			logf := func(format string, args ...any) {
				mu.Lock()
				defer mu.Unlock()
				logs = append(logs, format)
			}
			startCollector(t, nc, &recordingSink{}, Settings{Capture: true, IntakeMaxAge: 2 * time.Hour, Logf: logf})
			s, err := js.Stream(ctx, "FW_CAPTURE")
			if err != nil {
				t.Fatal(err)
			}
			cfg := s.CachedInfo().Config
			if cfg.PersistMode != tc.want {
				t.Errorf("persist mode %v, want %v", cfg.PersistMode, tc.want)
			}
			if cfg.MaxAge != 2*time.Hour {
				t.Errorf("max age %v, want the collector's 2h (the update was refused?)", cfg.MaxAge)
			}
			mu.Lock()
			defer mu.Unlock()
			for _, l := range logs {
				if strings.Contains(l, "update refused") {
					t.Errorf("logged %q", l)
				}
			}
		})
	}
}
