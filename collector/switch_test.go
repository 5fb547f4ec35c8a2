package collector

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fleetwatch/fleetwatch"
	"github.com/fleetwatch/fleetwatch/feed/feedtest"
)

// notAlone is Settings.CatchUp of a collector beside running ones.
func notAlone() bool { return false }

// streamExists reports whether the stream name exists.
func streamExists(t *testing.T, js jetstream.JetStream, name string) bool {
	t.Helper()
	_, err := js.Stream(t.Context(), name)
	if err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) {
		t.Fatal(err)
	}
	return err == nil
}

// publishFailures publishes n events of backend on pool p, one message
// each.
func publishFailures(t *testing.T, nc *nats.Conn, backend string, n int) {
	t.Helper()
	for range n {
		publish(t, nc, "fw.outcomes.edge", fmt.Sprintf(`{"pool":"p","backend":%q,"status":503}`, backend))
	}
}

// waitRepublished waits until FW_OUTCOMES holds every batch the stopped
// collectors cs republished. The republish is a core publish: the stream
// may store the last batch after events published right after the stop
// are stored in the capture, and the catch-up, which starts after the
// last batch's time, would skip them.
func waitRepublished(t *testing.T, js jetstream.JetStream, cs ...*Collector) {
	t.Helper()
	var want uint64
	for _, c := range cs {
		want += c.Stats().StreamPublished
	}
	waitStored(t, js, "FW_OUTCOMES", want)
}

// waitStored waits until stream holds n messages.
func waitStored(t *testing.T, js jetstream.JetStream, stream string, n uint64) {
	t.Helper()
	waitFor(t, fmt.Sprintf("%s holding %d messages", stream, n), func() bool {
		s, err := js.Stream(t.Context(), stream)
		return err == nil && s.CachedInfo().State.Msgs == n
	})
}

// countBackend is how many events of backend sink holds.
func countBackend(sink interface{ snapshot() []fleetwatch.Event }, backend string) int {
	n := 0
	for _, ev := range sink.snapshot() {
		if ev.Backend == backend {
			n++
		}
	}
	return n
}

// TestCaptureIsRetriedUntilItExists: beside running collectors, a capture
// that a leftover FW_INTAKE is in the way of is refused with an error that
// names FW_INTAKE and the command that deletes it, reported missing while
// the leftover is kept (running collectors may still consume it), and
// created once the stream is gone, without a restart.
func TestCaptureIsRetriedUntilItExists(t *testing.T) {
	t.Parallel()
	url, _ := feedtest.NewServer(t)
	nc := feedtest.Connect(t, url)
	js, _ := jetstream.New(nc)
	if _, err := New(nc, &recordingSink{}, Settings{Intake: true}); err != nil {
		t.Fatal(err) // FW_INTAKE and its consumer, as ingest.durable: true leaves them
	}
	c, _ := startCollector(t, nc, &recordingSink{}, Settings{Capture: true, CatchUp: notAlone})
	st := c.Stats()
	if !st.CaptureWanted || st.Capture || !errors.Is(st.CaptureErr, ErrStreamOverlap) {
		t.Fatalf("capture wanted %v, in place %v, error %v; want wanted, missing, ErrStreamOverlap", st.CaptureWanted, st.Capture, st.CaptureErr)
	}
	if msg := st.CaptureErr.Error(); !strings.Contains(msg, "stream FW_INTAKE") || !strings.Contains(msg, "`nats stream rm FW_INTAKE`") {
		t.Errorf("the error does not name FW_INTAKE and the command that deletes it: %s", msg)
	}
	if got := metricValue(t, c, "fleetwatch_capture_missing"); got != 1 {
		t.Errorf("fleetwatch_capture_missing = %v, want 1", got)
	}
	if !streamExists(t, js, "FW_INTAKE") {
		t.Fatal("FW_INTAKE was deleted beside running collectors")
	}

	if err := js.DeleteStream(t.Context(), "FW_INTAKE"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the capture created once FW_INTAKE is gone", func() bool { return c.Stats().Capture })
	if st := c.Stats(); st.CaptureErr != nil || !streamExists(t, js, "FW_CAPTURE") || metricValue(t, c, "fleetwatch_capture_missing") != 0 {
		t.Errorf("capture in place, but error %v, FW_CAPTURE exists %v, missing gauge %v", st.CaptureErr, streamExists(t, js, "FW_CAPTURE"), metricValue(t, c, "fleetwatch_capture_missing"))
	}
}

// TestCaptureLostIsRecreated: a capture deleted while collectors run is
// created again when Ensure finds it missing (serve calls it after a
// reconnect).
func TestCaptureLostIsRecreated(t *testing.T) {
	t.Parallel()
	url, _ := feedtest.NewServer(t)
	nc := feedtest.Connect(t, url)
	js, _ := jetstream.New(nc)
	c, _ := startCollector(t, nc, &recordingSink{}, Settings{Capture: true})
	if !c.Stats().Capture {
		t.Fatalf("no capture at start: %v", c.Stats().CaptureErr)
	}
	// A stream in the capture's way, where it was.
	if err := js.DeleteStream(t.Context(), "FW_CAPTURE"); err != nil {
		t.Fatal(err)
	}
	if _, err := js.CreateStream(t.Context(), jetstream.StreamConfig{Name: "AUDIT", Subjects: []string{"fw.outcomes.>"}}); err != nil {
		t.Fatal(err)
	}
	if err := c.Ensure(t.Context()); err != nil {
		t.Fatal(err)
	}
	st := c.Stats()
	if st.Capture || !errors.Is(st.CaptureErr, ErrStreamOverlap) || !strings.Contains(st.CaptureErr.Error(), "`nats stream rm AUDIT`") {
		t.Fatalf("after Ensure: in place %v, error %v; want missing, naming AUDIT", st.Capture, st.CaptureErr)
	}
	if err := js.DeleteStream(t.Context(), "AUDIT"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the capture created again", func() bool { return c.Stats().Capture })
}

// TestCaptureTakesOverALeftoverIntake: a collector with the capture that
// starts alone beside a leftover FW_INTAKE decides on what it holds that
// no collector took, exactly once, deletes it and creates the capture. The
// leftover also holds what a collector without capture took live before
// (serve before this fix ran so beside it): that is not decided on again.
func TestCaptureTakesOverALeftoverIntake(t *testing.T) {
	t.Parallel()
	url, _ := feedtest.NewServer(t)
	nc := feedtest.Connect(t, url)
	js, _ := jetstream.New(nc)
	durable, stopDurable := startCollector(t, nc, &recordingSink{}, Settings{Intake: true})
	publishFailures(t, nc, "durable", 5)
	waitFor(t, "the durable events", func() bool { return durable.Stats().Messages == 5 })
	stopDurable()
	// A collector that does not take FW_INTAKE over (told it runs beside
	// others; serve before the takeover existed did the same alone) takes
	// events live while FW_INTAKE stores them too.
	live := &recordingSink{}
	liveCollector, stopLive := startCollector(t, nc, live, Settings{Capture: true, CatchUp: notAlone})
	publishFailures(t, nc, "live", 40)
	waitFor(t, "the live events", func() bool { return live.len() == 40 })
	stopLive()
	waitRepublished(t, js, durable, liveCollector)
	publishFailures(t, nc, "down", 9) // while none runs

	sink := &recordingSink{}
	c, _ := startCollector(t, nc, sink, Settings{Capture: true})
	if got := countBackend(sink, "down"); got != 9 {
		t.Errorf("%d events of down decided on at start, want the 9 published while no collector ran", got)
	}
	// None of durable again (the intake's take-over), and of live at most
	// what the take-over replays of the stopped collector's last events:
	// the leftover intake may store one after that collector's last
	// republished batch, and the take-over matches only events sent with
	// a ts (these have none) when the intake no longer holds every
	// message of the seconds before that batch (durable's were
	// acknowledged, so deleted: a copy to take off may be missing);
	// docs/DECISIONS.md "Catch-up after a republished batch" (8 of 40
	// came again in a loaded CI run).
	again := countBackend(sink, "live")
	if got := countBackend(sink, "durable"); got != 0 || again > 40 {
		t.Errorf("%d events of durable and %d of live decided on again, want none of durable, at most the 40 of live", got, again)
	}
	st := c.Stats()
	if !st.Capture || st.CaptureErr != nil || st.CaptureReplayed != uint64(9+again) {
		t.Errorf("capture in place %v, error %v, %d replayed; want in place, 9 replayed (and the %d of live again)", st.Capture, st.CaptureErr, st.CaptureReplayed, again)
	}
	if streamExists(t, js, "FW_INTAKE") || !streamExists(t, js, "FW_CAPTURE") {
		t.Errorf("FW_INTAKE exists %v, FW_CAPTURE exists %v; want only FW_CAPTURE", streamExists(t, js, "FW_INTAKE"), streamExists(t, js, "FW_CAPTURE"))
	}
	publishFailures(t, nc, "after", 3)
	waitFor(t, "live events after the takeover", func() bool { return countBackend(sink, "after") >= 3 })
	time.Sleep(100 * time.Millisecond) // a duplicate would arrive within this
	if got := countBackend(sink, "after"); got != 3 {
		t.Errorf("%d events of after, want 3", got)
	}
}

// TestIntakeTakesOverTheCapture: a collector with the durable intake that
// starts alone beside FW_CAPTURE decides on what it holds that no
// collector took, deletes it and consumes FW_INTAKE, every event once;
// beside running collectors it refuses with an error that names
// FW_CAPTURE and the command that deletes it.
func TestIntakeTakesOverTheCapture(t *testing.T) {
	t.Parallel()
	url, _ := feedtest.NewServer(t)
	nc := feedtest.Connect(t, url)
	js, _ := jetstream.New(nc)
	first := &recordingSink{}
	firstCollector, stopFirst := startCollector(t, nc, first, Settings{Capture: true})
	publishFailures(t, nc, "live", 4)
	waitFor(t, "the live events", func() bool { return first.len() == 4 })
	stopFirst()
	waitRepublished(t, js, firstCollector)
	publishFailures(t, nc, "down", 11) // while none runs

	_, err := New(nc, &recordingSink{}, Settings{Intake: true, CatchUp: notAlone})
	if !errors.Is(err, ErrStreamOverlap) || !strings.Contains(err.Error(), "stream FW_CAPTURE") || !strings.Contains(err.Error(), "`nats stream rm FW_CAPTURE`") {
		t.Errorf("New with the intake beside a running collector: %v; want ErrStreamOverlap naming FW_CAPTURE and the command", err)
	}

	// Events published all through the hand-over from the core
	// subscriptions to the intake, from the moment the catch-up hands its
	// events over (its range is known by then), on a connection of their
	// own: none may be lost.
	sink := &signallingSink{started: make(chan struct{})}
	pub := feedtest.Connect(t, url)
	during := make(chan int)
	stopPublishing := make(chan struct{})
	go func() {
		n := 0
		defer func() { during <- n }()
		select {
		case <-sink.started:
		case <-stopPublishing:
			return
		}
		for {
			select {
			case <-stopPublishing:
				if err := pub.Flush(); err != nil {
					t.Error(err)
				}
				return
			default:
			}
			n++
			if err := pub.Publish("fw.outcomes.edge", fmt.Appendf(nil, `{"pool":"p","backend":"during","status":200,"ttft_ms":%d}`, n)); err != nil {
				t.Error(err)
			}
			time.Sleep(100 * time.Microsecond)
		}
	}()
	c, err := New(nc, sink, Settings{Intake: true})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	errc := make(chan error, 1)
	go func() { errc <- c.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-errc; err != nil {
			t.Errorf("Run: %v", err)
		}
	}()
	select {
	case <-c.Ready():
	case err := <-errc:
		t.Fatalf("Run: %v", err)
	}
	time.Sleep(50 * time.Millisecond) // some published after the switch too
	close(stopPublishing)
	published := <-during
	waitFor(t, "every event published during the hand-over", func() bool { return countBackend(sink, "during") >= published })
	time.Sleep(100 * time.Millisecond) // a late duplicate would arrive within this
	seen := map[float64]int{}
	for _, ev := range sink.snapshot() {
		if ev.Backend == "during" {
			seen[ev.TTFTMs]++
		}
	}
	twice := 0
	for i := 1; i <= published; i++ {
		switch seen[float64(i)] {
		case 0:
			t.Errorf("event %d of the %d published during the hand-over is lost", i, published)
		case 1:
		default:
			twice++
		}
	}
	t.Logf("%d events published during the hand-over, %d of them taken by both the core subscriptions and the intake", published, twice)
	if got := countBackend(sink, "down"); got != 11 {
		t.Errorf("%d events of down decided on, want the 11 published while no collector ran", got)
	}
	if streamExists(t, js, "FW_CAPTURE") || !streamExists(t, js, "FW_INTAKE") {
		t.Errorf("FW_CAPTURE exists %v, FW_INTAKE exists %v; want only FW_INTAKE", streamExists(t, js, "FW_CAPTURE"), streamExists(t, js, "FW_INTAKE"))
	}
	publishFailures(t, nc, "after", 300)
	waitFor(t, "the events published after the switch", func() bool { return countBackend(sink, "after") >= 300 })
	time.Sleep(200 * time.Millisecond) // a duplicate would arrive within this
	// None of the 4 live events again: under load the capture may store
	// one after the first collector's last republished batch, and the
	// catch-up leaves such copies out (docs/DECISIONS.md "No silent
	// loss"; before it, 3 of 4 came again in a loaded CI run).
	if got, lost := countBackend(sink, "after"), c.Stats().IntakeLost; got != 300 || countBackend(sink, "live") != 0 || lost != 0 {
		t.Errorf("%d events of after (want 300), %d of live again (want none), %d counted lost (want 0)", got, countBackend(sink, "live"), lost)
	}
}

// TestCatchUpEndedEarlyIsCounted: when the capture loses what the
// catch-up has not replayed yet (its bounds discard it; purged here), the
// catch-up ends early and counts every message it did not replay.
func TestCatchUpEndedEarlyIsCounted(t *testing.T) {
	t.Parallel()
	url, _ := feedtest.NewServer(t)
	nc := feedtest.Connect(t, url)
	js, _ := jetstream.New(nc)
	first, stop := startCollector(t, nc, &recordingSink{}, Settings{Capture: true})
	publishFailures(t, nc, "live", 1)
	stop()
	waitRepublished(t, js, first)
	const published = 3000
	for i := range published {
		if err := nc.Publish("fw.outcomes.edge", fmt.Appendf(nil, `{"pool":"p","backend":"b%d","status":200}`, i%5)); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, "the capture holding every event", func() bool {
		s, err := js.Stream(t.Context(), "FW_CAPTURE")
		return err == nil && s.CachedInfo().State.Msgs > published
	})
	purging := &purgingSink{js: js}
	c, _ := startCollector(t, nc, purging, Settings{Capture: true, BatchSize: 1})
	st := c.Stats()
	t.Logf("replayed %d, unreplayed %d: %v", st.CaptureReplayed, st.CaptureUnreplayed, st.CatchUpErr)
	if !errors.Is(st.CatchUpErr, ErrReplayEndedEarly) {
		t.Fatalf("catch-up error %v, want ErrReplayEndedEarly", st.CatchUpErr)
	}
	// Not the live event: the capture may store it after the first
	// collector's last republished batch, and the catch-up leaves such a
	// copy out (docs/DECISIONS.md "No silent loss"; before it, 3001 in a
	// loaded CI run).
	if all := st.CaptureReplayed + st.CaptureUnreplayed; st.CaptureUnreplayed == 0 || all != published {
		t.Errorf("replayed %d + unreplayed %d, want both > 0 and %d in all", st.CaptureReplayed, st.CaptureUnreplayed, published)
	}
	if got := metricValue(t, c, "fleetwatch_capture_unreplayed_messages_total"); got != float64(st.CaptureUnreplayed) {
		t.Errorf("fleetwatch_capture_unreplayed_messages_total = %v, want %d", got, st.CaptureUnreplayed)
	}
}

// signallingSink closes started when it observes its first batch.
type signallingSink struct {
	recordingSink
	started chan struct{}
	once    sync.Once
}

func (s *signallingSink) Observe(batch []fleetwatch.Event) bool {
	s.once.Do(func() { close(s.started) })
	return s.recordingSink.Observe(batch)
}

// purgingSink purges FW_CAPTURE when it observes its first batch.
type purgingSink struct {
	recordingSink
	js   jetstream.JetStream
	once sync.Once
}

func (s *purgingSink) Observe(batch []fleetwatch.Event) bool {
	s.once.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		stream, err := s.js.Stream(ctx, "FW_CAPTURE")
		if err == nil {
			err = stream.Purge(ctx)
		}
		if err != nil {
			panic(err) // a test bug
		}
	})
	return s.recordingSink.Observe(batch)
}

// metricValue is the value of the series name in c's metrics.
func metricValue(t *testing.T, c *Collector, name string) float64 {
	t.Helper()
	var out bytes.Buffer
	c.Metrics().WritePrometheus(&out)
	for line := range strings.Lines(out.String()) {
		if value, ok := strings.CutPrefix(strings.TrimSpace(line), name+" "); ok {
			v, err := strconv.ParseFloat(value, 64)
			if err != nil {
				t.Fatal(err)
			}
			return v
		}
	}
	t.Fatalf("no series %s", name)
	return 0
}

// TestLeftoverIsNamedWithoutEither: a collector with neither the capture
// nor the intake (ingest.durable: false) leaves a stream of another
// setting in place and says how to delete it.
func TestLeftoverIsNamedWithoutEither(t *testing.T) {
	t.Parallel()
	url, _ := feedtest.NewServer(t)
	nc := feedtest.Connect(t, url)
	if _, err := New(nc, &recordingSink{}, Settings{Intake: true}); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var logs []string
	logf := func(format string, args ...any) {
		mu.Lock()
		defer mu.Unlock()
		logs = append(logs, fmt.Sprintf(format, args...))
	}
	if _, err := New(nc, &recordingSink{}, Settings{Logf: logf}); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	for _, l := range logs {
		if strings.Contains(l, "stream FW_INTAKE is left over") && strings.Contains(l, "`nats stream rm FW_INTAKE`") {
			return
		}
	}
	t.Errorf("nothing logged names the leftover FW_INTAKE and how to delete it: %q", logs)
}
