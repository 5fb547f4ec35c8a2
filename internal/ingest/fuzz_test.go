package ingest_test

import (
	"bytes"
	"sync"
	"testing"

	"github.com/fleetwatch/fleetwatch"
	"github.com/fleetwatch/fleetwatch/internal/ingest"
)

func checkAttempts(t *testing.T, attempts []ingest.Attempt) {
	for _, a := range attempts {
		if a.Upstream == "" || a.Status < 0 || a.TTFTMs < 0 || a.DurationMs < 0 ||
			(!a.HasTTFT && a.TTFTMs != 0) || (!a.HasDuration && a.DurationMs != 0) {
			t.Fatalf("attempt %+v", a)
		}
	}
}

func FuzzParseNginx(f *testing.F) {
	f.Add([]byte(`{"msec":"1764741600.123","status":"200","upstream_name":"llama","upstream_addr":"10.0.0.1:8000, 10.0.0.2:8000 : 10.0.0.3:80","upstream_status":"502, 500 : 200","upstream_header_time":"-, 0.010 : 0.2","upstream_response_time":"0.001, 0.011 : 0.9"}`))
	f.Add([]byte(`<190>Dec  3 06:00:00 web nginx: {"status":499,"upstream_addr":"a","upstream_status":"-"}`))
	f.Add([]byte(`{"upstream_addr":null}`))
	f.Fuzz(func(t *testing.T, line []byte) {
		attempts, err := ingest.ParseNginx(ingest.SyslogMessage(line), nil)
		if err != nil && len(attempts) != 0 {
			t.Fatalf("attempts with an error: %+v", attempts)
		}
		checkAttempts(t, attempts)
	})
}

func FuzzParseHAProxy(f *testing.F) {
	f.Add([]byte(`<134>Dec  3 06:00:00 haproxy[4242]: 10.1.2.3:40000 [03/Dec/2026:06:00:00.123] fe llama/s1 2/0/1/150/1203 200 512 - - ---- 3/3/1/1/+1 0/0 "POST / HTTP/1.1"`))
	f.Add([]byte(`{"backend":"llama","server":"s0","status":500,"TR":1,"Tw":0,"Tc":1,"Tr":5,"Ta":7,"termination_state":"----"}`))
	f.Add([]byte(`a:1 [x] fe b/<NOSRV> -1/-1/-1/-1/0 503 0 - - SC-- 0/0/0/0/0 0/0`))
	f.Fuzz(func(t *testing.T, line []byte) {
		attempts, err := ingest.ParseHAProxy(ingest.SyslogMessage(line), nil)
		if err != nil && len(attempts) != 0 {
			t.Fatalf("attempts with an error: %+v", attempts)
		}
		if len(attempts) > 1 {
			t.Fatalf("%d attempts from one HAProxy line", len(attempts))
		}
		checkAttempts(t, attempts)
	})
}

func FuzzSyslogMessage(f *testing.F) {
	f.Add([]byte(`<134>1 2026-12-03T06:00:00Z host app 1 ID47 [x@1 a="\]"][y@2] msg`))
	f.Add([]byte(`<134>Dec  3 06:00:00 haproxy[1]: hello`))
	f.Add([]byte(`<1`))
	f.Fuzz(func(t *testing.T, line []byte) {
		msg := ingest.SyslogMessage(line)
		if len(msg) > len(line) || (len(msg) > 0 && !bytes.Contains(line, msg)) {
			t.Fatalf("SyslogMessage(%q) = %q is not part of it", line, msg)
		}
	})
}

func FuzzMapLiteLLM(f *testing.F) {
	f.Add([]byte(`{"status":"success","model_group":"gpt-4o","api_base":"https://a/v1","startTime":1764741600.0,"completionStartTime":1764741600.2,"endTime":1764741601.0,"prompt_tokens":3,"completion_tokens":4}`))
	f.Add([]byte(`{"status":"failure","model":"m","hidden_params":{"api_base":"h"},"error_information":{"error_code":"429"},"response_time":-1}`))
	f.Add([]byte(`{"status":"success","model_group":"g","api_base":"x","startTime":1e300,"endTime":-1e300,"completionStartTime":1e308}`))
	var dec fleetwatch.Decoder
	f.Fuzz(func(t *testing.T, payload []byte) {
		var ev fleetwatch.Event
		skip, err := ingest.MapLiteLLM(payload, ingest.LiteLLMSettings{}, nil, &ev)
		if err != nil || skip != "" {
			return
		}
		if ev.Pool == "" || ev.Backend == "" || ev.DurationMs < 0 || ev.TTFTMs < 0 || (ev.HasTTFT && ev.HasDuration && ev.TTFTMs > ev.DurationMs) {
			t.Fatalf("event %+v", ev)
		}
		// What the adapter publishes is what the collector reads back,
		// or a reject with a reason.
		var back fleetwatch.Event
		if err := dec.Decode(fleetwatch.AppendEvent(nil, &ev), &back); err != nil && fleetwatch.ReasonOf(err) == "" {
			t.Fatalf("reject without a reason: %v", err)
		}
	})
}

// recorder is an in-memory Publisher: what the emitter would send to NATS.
type recorder struct {
	mu   sync.Mutex // guards msgs
	msgs map[string][][]byte
}

func (r *recorder) Publish(subject string, data []byte) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.msgs == nil {
		r.msgs = map[string][][]byte{}
	}
	r.msgs[subject] = append(r.msgs[subject], bytes.Clone(data))
	return nil
}

// FuzzBatchAddRaw: whatever a client posts to /v1/outcomes, every event
// counts once (accepted or rejected, as the collector's DecodeBatch sees
// it), every published message is NDJSON of valid events of its subject's
// pool, and no message exceeds the limit unless it holds one event.
func FuzzBatchAddRaw(f *testing.F) {
	f.Add([]byte("{\"pool\":\"p\",\"backend\":\"b\",\"status\":200}\n{\"pool\":\"q\",\"backend\":\"c\",\"ttft_ms\":-1}\n\n{bad\n"))
	f.Add([]byte("{\n \"pool\": \"p\",\n \"backend\": \"b\"\n}"))
	// A rejected event of a pool before the pool's first valid one.
	f.Add([]byte("{\"pool\":\"p\",\"backend\":\"b\",\"ttft_ms\":-1}\n{\"pool\":\"p\",\"backend\":\"b\"}\n"))
	f.Fuzz(func(t *testing.T, body []byte) {
		rec := &recorder{}
		e := ingest.NewEmitter(rec, ingest.EmitterSettings{MaxMessage: 200})
		m := ingest.NewMetrics(nil, ingest.AdapterOutcomes)
		b := e.NewBatch(m)
		b.AddRaw(body, 1)
		var dec fleetwatch.Decoder
		ok, bad := dec.DecodeBatch(body, func([]byte, *fleetwatch.Event, error) {})
		if b.Accepted+len(b.Rejects) != ok+bad {
			t.Fatalf("accepted %d + rejected %d != %d objects", b.Accepted, len(b.Rejects), ok+bad)
		}
		n, err := b.Emit()
		if err != nil || n != b.Accepted {
			t.Fatalf("published %d of %d: %v", n, b.Accepted, err)
		}
		for subject, msgs := range rec.msgs {
			for _, msg := range msgs {
				lines := bytes.Count(msg, []byte{'\n'})
				if len(msg) > 200 && lines > 1 {
					t.Fatalf("a message of %d bytes and %d events", len(msg), lines)
				}
				dec.DecodeBatch(msg, func(line []byte, ev *fleetwatch.Event, err error) {
					if err != nil || subject != "fw.outcomes."+ev.Pool {
						t.Fatalf("published %q on %s: %v", line, subject, err)
					}
				})
			}
		}
	})
}

// TestBatchRejectThenAccept: an event rejected before its pool's first
// valid event does not keep the valid ones from being published.
func TestBatchRejectThenAccept(t *testing.T) {
	rec := &recorder{}
	b := ingest.NewEmitter(rec, ingest.EmitterSettings{}).NewBatch(ingest.NewMetrics(nil, ingest.AdapterOTLP))
	b.Add(&fleetwatch.Event{Pool: "p", Backend: "", Status: 200, HasStatus: true}, 0)
	b.Add(&fleetwatch.Event{Pool: "p", Backend: "b", Status: 200, HasStatus: true}, 0)
	if n, err := b.Emit(); n != 1 || err != nil || len(b.Rejects) != 1 || b.Rejects[0].Reason != fleetwatch.ReasonInvalidBackend {
		t.Errorf("published %d (%v), rejects %+v", n, err, b.Rejects)
	}
	if len(rec.msgs["fw.outcomes.p"]) != 1 {
		t.Errorf("messages %v", rec.msgs)
	}
}
