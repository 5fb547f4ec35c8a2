package ingest_test

import (
	"errors"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/fleetwatch/fleetwatch"
	"github.com/fleetwatch/fleetwatch/internal/ingest"
)

func TestParseNginx(t *testing.T) {
	ts := time.UnixMilli(1764741600123).UTC()
	tests := []struct {
		name string
		line string
		want []ingest.Attempt
		err  error
	}{
		{
			name: "one upstream",
			line: `{"msec":"1764741600.123","status":"200","upstream_name":"llama","upstream_addr":"10.0.0.1:8000","upstream_status":"200","upstream_header_time":"0.150","upstream_response_time":"1.250"}`,
			want: []ingest.Attempt{{Upstream: "10.0.0.1:8000", Group: "llama", Status: 200, TTFTMs: 150, HasTTFT: true, DurationMs: 1250, HasDuration: true, TS: ts}},
		},
		{
			name: "a retry and an internal redirect, a pool field, a syslog header",
			line: `<190>Dec  3 06:00:00 web nginx: {"msec":"1764741600.123","status":"200","pool":"chat","upstream_addr":"10.0.0.1:8000, 10.0.0.2:8000 : unix:/run/b.sock","upstream_status":"502, 500 : 200","upstream_header_time":"-, 0.010 : 0.200","upstream_response_time":"0.001, 0.011 : 0.900"}`,
			want: []ingest.Attempt{
				{Upstream: "10.0.0.1:8000", Pool: "chat", Status: 502, DurationMs: 1, HasDuration: true, TS: ts},
				{Upstream: "10.0.0.2:8000", Pool: "chat", Status: 500, TTFTMs: 10, HasTTFT: true, DurationMs: 11, HasDuration: true, TS: ts},
				{Upstream: "unix:/run/b.sock", Pool: "chat", Status: 200, TTFTMs: 200, HasTTFT: true, DurationMs: 900, HasDuration: true, TS: ts},
			},
		},
		{
			name: "the client went away before the upstream answered",
			line: `{"status":"499","upstream_name":"llama","upstream_addr":"10.0.0.1:8000","upstream_status":"-","upstream_header_time":"-","upstream_response_time":"3.000"}`,
			want: []ingest.Attempt{{Upstream: "10.0.0.1:8000", Group: "llama", Status: 499, DurationMs: 3000, HasDuration: true}},
		},
		{
			name: "no live upstream: nginx logs the group's name",
			line: `{"status":"502","upstream_name":"llama","upstream_addr":"llama","upstream_status":"-"}`,
		},
		{name: "nginx answered itself", line: `{"status":"200","upstream_addr":"","upstream_status":""}`},
		{name: "not JSON", line: `127.0.0.1 - - [03/Dec/2026] "GET /"`, err: ingest.ErrBadLine},
		{name: "broken JSON", line: `{"status":`, err: ingest.ErrBadLine},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ingest.ParseNginx(ingest.SyslogMessage([]byte(tc.line)), nil)
			if !errors.Is(err, tc.err) {
				t.Fatalf("err = %v, want %v", err, tc.err)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}

func TestParseHAProxy(t *testing.T) {
	accept := time.Date(2026, 12, 3, 6, 0, 0, 123e6, time.UTC)
	tests := []struct {
		name string
		line string
		want []ingest.Attempt
		err  error
	}{
		{
			name: "httplog over syslog",
			line: `<134>Dec  3 06:00:00 haproxy[4242]: 10.1.2.3:40000 [03/Dec/2026:06:00:00.123] fe~ llama/s1 2/0/1/150/1203 200 512 - - ---- 3/3/1/1/0 0/0 {host} "POST /v1/chat/completions HTTP/1.1"`,
			want: []ingest.Attempt{{Upstream: "llama/s1", Group: "llama", Backend: "s1", Status: 200, TTFTMs: 150, HasTTFT: true, DurationMs: 1200, HasDuration: true, TS: accept.Add(1203 * time.Millisecond)}},
		},
		{
			name: "server timeout after a redispatch",
			line: `10.1.2.3:40000 [03/Dec/2026:06:00:00.123] fe llama/s0 0/0/1/-1/10001 504 194 - - sH-- 1/1/0/0/+1 0/0 "GET / HTTP/1.1"`,
			want: []ingest.Attempt{{Upstream: "llama/s0", Group: "llama", Backend: "s0", Status: 504, DurationMs: 10000, HasDuration: true, TS: accept.Add(10001 * time.Millisecond)}},
		},
		{
			name: "client abort",
			line: `10.1.2.3:40000 [03/Dec/2026:06:00:00.123] fe llama/s0 0/0/1/20/500 200 100 - - CD-- 1/1/0/0/0 0/0 "GET / HTTP/1.1"`,
			want: []ingest.Attempt{{Upstream: "llama/s0", Group: "llama", Backend: "s0", Status: 499, TTFTMs: 20, HasTTFT: true, DurationMs: 499, HasDuration: true, TS: accept.Add(500 * time.Millisecond)}},
		},
		{
			name: "no server",
			line: `10.1.2.3:40000 [03/Dec/2026:06:00:00.123] fe llama/<NOSRV> -1/-1/-1/-1/0 503 0 - - SC-- 0/0/0/0/0 0/0 "GET / HTTP/1.1"`,
		},
		{
			name: "JSON log-format",
			line: `<134>1 2026-12-03T06:00:00.123Z host haproxy 4242 - - {"msec":"1764741600.123","backend":"llama","server":"s0","status":500,"TR":1,"Tw":0,"Tc":1,"Tr":5,"Ta":7,"retries":"0","termination_state":"----"}`,
			want: []ingest.Attempt{{Upstream: "llama/s0", Group: "llama", Backend: "s0", Status: 500, TTFTMs: 5, HasTTFT: true, DurationMs: 5, HasDuration: true, TS: time.UnixMilli(1764741600130).UTC()}},
		},
		{name: "a notice", line: `<133>Dec  3 06:00:00 haproxy[4242]: Proxy fe started.`, err: ingest.ErrBadLine},
		{name: "bad timers", line: `10.1.2.3:1 [03/Dec/2026:06:00:00.123] fe llama/s0 0/0/x/1/2 200 1 - - ---- 0/0/0/0/0 0/0 "GET /"`, err: ingest.ErrBadLine},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ingest.ParseHAProxy(ingest.SyslogMessage([]byte(tc.line)), nil)
			if !errors.Is(err, tc.err) {
				t.Fatalf("err = %v, want %v", err, tc.err)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}

func TestSyslogMessage(t *testing.T) {
	for in, want := range map[string]string{
		`<134>Dec  3 06:00:00 haproxy[1]: hello: world`:                          `hello: world`,
		`<190>Dec 13 06:00:00 web nginx: {"a":1}`:                                `{"a":1}`,
		`<134>1 2026-12-03T06:00:00Z host app 1 ID47 [x@1 a="\]"][y@2] msg here`: `msg here`,
		`<134>1 2026-12-03T06:00:00Z host app 1 - - msg`:                         `msg`,
		`{"raw":true}` + "\n":                                                    `{"raw":true}`,
		`Dec  3 06:00:00 host haproxy[9]: line from rsyslog`:                     `line from rsyslog`,
	} {
		if got := string(ingest.SyslogMessage([]byte(in))); got != want {
			t.Errorf("SyslogMessage(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestPoolID(t *testing.T) {
	for in, want := range map[string]string{
		"gpt-4o": "gpt-4o", "llama3:8b": "llama3_8b", "Qwen/Qwen2.5 7B": "Qwen/Qwen2.5_7B",
		".x.": "_x_", "a..b": "a._b", "": "",
	} {
		got := ingest.PoolID(in)
		if got != want {
			t.Errorf("PoolID(%q) = %q, want %q", in, got, want)
		}
		if got != "" && fleetwatch.ValidatePoolID(got) != nil {
			t.Errorf("PoolID(%q) = %q is not valid", in, got)
		}
	}
}

func TestMapping(t *testing.T) {
	m := ingest.NewMapping([]ingest.Upstream{
		{Match: "http://a:8000/v1/", Pool: "p1", Backend: "a"},
		{Match: "b:80", Backend: "b"},
	}, false, "fallback")
	listed := ingest.NewMapping([]ingest.Upstream{{Match: "b:80"}}, true, "")
	tests := []struct {
		m                          *ingest.Mapping
		upstream, pool, backend    string
		wantPool, wantBackend, why string
	}{
		{m, "http://a:8000/v1", "model", "", "p1", "a", ""},
		{m, "b:80", "model:x", "", "model_x", "b", ""},
		{m, "c:80", "", "", "fallback", "c:80", ""},
		{m, "be/srv", "be", "srv", "be", "srv", ""},
		{listed, "c:80", "p", "", "", "", ingest.SkipUnmapped},
		{listed, "b:80", "", "", "", "", ingest.SkipNoPool},
		{nil, "x", "p", "", "p", "x", ""},
	}
	for _, tc := range tests {
		pool, backend, why := tc.m.Resolve(tc.upstream, tc.pool, tc.backend)
		if pool != tc.wantPool || backend != tc.wantBackend || why != tc.why {
			t.Errorf("Resolve(%q, %q, %q) = %q, %q, %q; want %q, %q, %q", tc.upstream, tc.pool, tc.backend,
				pool, backend, why, tc.wantPool, tc.wantBackend, tc.why)
		}
	}
}

func TestMapLiteLLM(t *testing.T) {
	tests := []struct {
		name     string
		payload  string
		settings ingest.LiteLLMSettings
		want     fleetwatch.Event
		skip     string
	}{
		{
			name:    "success with TTFT",
			payload: `{"status":"success","model_group":"gpt-4o","api_base":"https://a/v1","startTime":1764741600.0,"completionStartTime":1764741600.2,"endTime":1764741601.0,"prompt_tokens":3,"completion_tokens":4}`,
			want: fleetwatch.Event{Pool: "gpt-4o", Backend: "https://a/v1", TS: time.Unix(1764741601, 0).UTC(), Status: 200, HasStatus: true,
				Outcome: fleetwatch.OutcomeOK, TTFTMs: 200, HasTTFT: true, DurationMs: 1000, HasDuration: true, InputTokens: 3, OutputTokens: 4},
		},
		{
			name:    "a timeout, pool and backend from other fields, fallbacks",
			payload: `{"status":"failure","model":"m","model_group":null,"hidden_params":{"api_base":"http://h:1"},"error_information":{"error_code":null,"error_class":"Timeout"},"response_time":30}`,
			want: fleetwatch.Event{Pool: "m", Backend: "http://h:1", Status: 0, HasStatus: true, Outcome: fleetwatch.OutcomeTimeout,
				DurationMs: 30000, HasDuration: true},
		},
		{
			name:     "a 503 as a number, configured fields",
			payload:  `{"status":"failure","model":"m","model_id":"dep-1","model_group":"g","error_information":{"error_code":503}}`,
			settings: ingest.LiteLLMSettings{PoolField: "model", BackendField: "model_id"},
			want:     fleetwatch.Event{Pool: "m", Backend: "dep-1", Status: 503, HasStatus: true, Outcome: fleetwatch.OutcomeError},
		},
		{
			name:    "string times without a zone (UTC), as LiteLLM's generic API logging example sends them",
			payload: `{"status":"success","model_group":"g","api_base":"x","startTime":"2026-12-03T06:00:00.123456","completionStartTime":"2026-12-03T06:00:00.373456","endTime":"2026-12-03T06:00:01.123456"}`,
			want: fleetwatch.Event{Pool: "g", Backend: "x", TS: time.Date(2026, 12, 3, 6, 0, 1, 123456000, time.UTC), Status: 200, HasStatus: true,
				Outcome: fleetwatch.OutcomeOK, TTFTMs: 250, HasTTFT: true, DurationMs: 1000, HasDuration: true},
		},
		{
			name:    "Python's datetime str() with a zone, and RFC 3339 with Z",
			payload: `{"status":"success","model_group":"g","api_base":"x","startTime":"2026-12-03 07:00:00+01:00","endTime":"2026-12-03T06:00:00.5Z"}`,
			want: fleetwatch.Event{Pool: "g", Backend: "x", TS: time.Date(2026, 12, 3, 6, 0, 0, 500000000, time.UTC), Status: 200, HasStatus: true,
				Outcome: fleetwatch.OutcomeOK, DurationMs: 500, HasDuration: true},
		},
		{
			name:    "Python's datetime str() without a zone",
			payload: `{"status":"failure","model_group":"g","api_base":"x","startTime":"2026-12-03 06:00:00.000001","endTime":"2026-12-03 06:00:02.000001"}`,
			want: fleetwatch.Event{Pool: "g", Backend: "x", TS: time.Date(2026, 12, 3, 6, 0, 2, 1000, time.UTC), Status: 500, HasStatus: true,
				Outcome: fleetwatch.OutcomeError, DurationMs: 2000, HasDuration: true},
		},
		{
			name:    "epoch seconds as strings",
			payload: `{"status":"success","model_group":"g","api_base":"x","startTime":"1764741600.0","endTime":" 1764741601.5 "}`,
			want: fleetwatch.Event{Pool: "g", Backend: "x", TS: time.UnixMilli(1764741601500).UTC(), Status: 200, HasStatus: true,
				Outcome: fleetwatch.OutcomeOK, DurationMs: 1500, HasDuration: true},
		},
		{name: "a cache hit", payload: `{"status":"success","model_group":"g","api_base":"x","cache_hit":true}`, skip: ingest.SkipNoUpstream},
		{name: "no status", payload: `{"model_group":"g","api_base":"x"}`, skip: ingest.SkipEventType},
		{name: "no backend", payload: `{"status":"success","model_group":"g"}`, skip: ingest.SkipNoUpstream},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var ev fleetwatch.Event
			skip, err := ingest.MapLiteLLM([]byte(tc.payload), tc.settings, nil, &ev)
			if err != nil || skip != tc.skip {
				t.Fatalf("skip %q err %v, want skip %q", skip, err, tc.skip)
			}
			if skip == "" {
				if diff := cmp.Diff(tc.want, ev); diff != "" {
					t.Errorf("(-want +got):\n%s", diff)
				}
			}
		})
	}
	var ev fleetwatch.Event
	if _, err := ingest.MapLiteLLM([]byte(`[1]`), ingest.LiteLLMSettings{}, nil, &ev); err == nil {
		t.Errorf("an array is not a payload")
	}
	if _, err := ingest.MapLiteLLM([]byte(`{"status":"success","model_group":"g","api_base":"x","endTime":"yesterday"}`), ingest.LiteLLMSettings{}, nil, &ev); err == nil {
		t.Errorf("endTime \"yesterday\" is not a time")
	}
}
