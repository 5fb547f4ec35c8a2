package testkit

import (
	"fmt"
	"testing"

	"github.com/fleetwatch/fleetwatch"
	"github.com/fleetwatch/fleetwatch/internal/fakeai"
)

// StartFakeBackends starts n fake OpenAI-compatible backends named b0, b1,
// ... on loopback ports; they stop in t.Cleanup.
func StartFakeBackends(t testing.TB, n int) []*fakeai.Server {
	t.Helper()
	out := make([]*fakeai.Server, n)
	for i := range out {
		srv, err := fakeai.Listen(fakeai.Settings{Name: fmt.Sprintf("b%d", i), Seed: uint64(i + 1)})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { srv.Close() })
		out[i] = srv
	}
	return out
}

// CheckEchoChatEvents checks the outcome events a router published for
// successful chat requests to StartFakeBackends' backends in pool, from
// source: each an ok with TTFT and duration (TTFT first); the first two,
// sent with the same system prompt, share a prefix hash, and carry the fake
// backends' fingerprint and 4 output tokens.
func CheckEchoChatEvents(t testing.TB, evs []fleetwatch.Event, pool, source string) {
	t.Helper()
	for _, ev := range evs {
		if ev.Pool != pool || ev.Status != 200 || ev.Outcome != fleetwatch.OutcomeOK || !ev.HasTTFT ||
			!ev.HasDuration || ev.Source != source || ev.TTFTMs > ev.DurationMs {
			t.Errorf("event %+v", ev)
		}
	}
	if len(evs) < 2 {
		t.Fatalf("%d events, want at least 2", len(evs))
	}
	if evs[0].Prefix == "" || evs[0].Prefix != evs[1].Prefix || evs[0].Fingerprint != "fp_echo" || evs[0].OutputTokens != 4 {
		t.Errorf("chat events: prefix %q %q fingerprint %q output %d", evs[0].Prefix, evs[1].Prefix, evs[0].Fingerprint, evs[0].OutputTokens)
	}
}
