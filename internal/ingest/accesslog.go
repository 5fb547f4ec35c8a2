package ingest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/fleetwatch/fleetwatch"
)

// Attempt is one request to one upstream as an access log line tells it;
// a line of nginx that retried holds several.
type Attempt struct {
	Upstream    string // the mapping key: an address, or HAProxy's backend/server
	Pool        string // the pool the line names (nginx's "pool" field), "" when none
	Group       string // the proxy's upstream group: nginx's $proxy_host, HAProxy's backend
	Backend     string // the backend the line names ("" : the upstream)
	Status      int    // the upstream's HTTP status; 0 when it never answered
	TTFTMs      float64
	HasTTFT     bool
	DurationMs  float64
	HasDuration bool
	TS          time.Time // when the line was written; zero when unknown
}

// ErrBadLine is returned for a log line that is not in the expected format.
var ErrBadLine = errors.New("ingest: not an access log line")

// jsonField reads a log field that may be a JSON string or number.
type jsonField string

func (f *jsonField) UnmarshalJSON(b []byte) error {
	if len(b) > 0 && b[0] == '"' {
		var s string
		if err := json.Unmarshal(b, &s); err != nil {
			return err
		}
		*f = jsonField(s)
		return nil
	}
	if bytes.Equal(b, []byte("null")) {
		*f = ""
		return nil
	}
	*f = jsonField(b)
	return nil
}

// nginxLine is the JSON log_format of docs/INTEGRATIONS.md.
type nginxLine struct {
	Msec             jsonField `json:"msec"`
	Status           jsonField `json:"status"`
	Pool             jsonField `json:"pool"`
	UpstreamName     jsonField `json:"upstream_name"`
	UpstreamAddr     jsonField `json:"upstream_addr"`
	UpstreamStatus   jsonField `json:"upstream_status"`
	UpstreamHeader   jsonField `json:"upstream_header_time"`
	UpstreamResponse jsonField `json:"upstream_response_time"`
}

// splitUpstreams splits one of nginx's $upstream_* variables: servers of
// one group separated by ", ", groups (an internal redirect) by " : ".
func splitUpstreams(v string) []string {
	v = strings.ReplaceAll(v, " : ", ", ")
	if strings.TrimSpace(v) == "" {
		return nil
	}
	parts := strings.Split(v, ",")
	for i := range parts {
		parts[i] = strings.TrimSpace(parts[i])
	}
	return parts
}

// seconds parses nginx's and HAProxy's "0.123" timings ("-" or "" : absent).
func seconds(v string) (float64, bool) {
	if v == "" || v == "-" {
		return 0, false
	}
	f, err := strconv.ParseFloat(v, 64)
	if err != nil || f < 0 || math.IsNaN(f) || math.IsInf(f, 0) {
		return 0, false
	}
	return f, true
}

// ParseNginx parses one line of the JSON log_format (after any syslog
// header) and appends one Attempt per upstream tried: $upstream_addr,
// $upstream_status, $upstream_header_time and $upstream_response_time list
// one value per attempt. A line with no upstream (nginx answered itself)
// appends none.
func ParseNginx(line []byte, out []Attempt) ([]Attempt, error) {
	i := bytes.IndexByte(line, '{')
	if i < 0 {
		return out, ErrBadLine
	}
	var l nginxLine
	if err := json.Unmarshal(line[i:], &l); err != nil {
		return out, fmt.Errorf("%w: %w", ErrBadLine, err)
	}
	var ts time.Time
	if sec, ok := seconds(string(l.Msec)); ok && sec > 0 && sec < 1e11 {
		ts = time.UnixMilli(int64(math.Round(sec * 1000))).UTC()
	}
	lineStatus, _ := strconv.Atoi(string(l.Status))
	pool := string(l.Pool)
	if pool == "-" {
		pool = ""
	}
	addrs := splitUpstreams(string(l.UpstreamAddr))
	statuses := splitUpstreams(string(l.UpstreamStatus))
	headers := splitUpstreams(string(l.UpstreamHeader))
	responses := splitUpstreams(string(l.UpstreamResponse))
	for k, addr := range addrs {
		if addr == "" || addr == "-" {
			continue
		}
		a := Attempt{Upstream: addr, Pool: pool, TS: ts}
		status := "-"
		if k < len(statuses) {
			status = statuses[k]
		}
		if n, err := strconv.Atoi(status); err == nil {
			a.Status = n
		} else if lineStatus == 499 {
			a.Status = 499 // the client went away before the upstream answered
		} else if addr == string(l.UpstreamName) && len(addrs) == 1 {
			continue // no server could be chosen: nginx keeps the group's name
		}
		if k < len(headers) {
			a.TTFTMs, a.HasTTFT = seconds(headers[k])
			a.TTFTMs *= 1000
		}
		if k < len(responses) {
			a.DurationMs, a.HasDuration = seconds(responses[k])
			a.DurationMs *= 1000
		}
		out = append(out, a)
	}
	for k := range out {
		out[k].Group = string(l.UpstreamName)
	}
	return out, nil
}

// haproxyJSON is the JSON log-format of docs/INTEGRATIONS.md.
type haproxyJSON struct {
	Backend     jsonField `json:"backend"`
	Server      jsonField `json:"server"`
	Status      jsonField `json:"status"`
	TR          jsonField `json:"TR"`
	Tw          jsonField `json:"Tw"`
	Tc          jsonField `json:"Tc"`
	Tr          jsonField `json:"Tr"`
	Ta          jsonField `json:"Ta"`
	Termination jsonField `json:"termination_state"`
	Msec        jsonField `json:"msec"`
}

// ParseHAProxy parses one HAProxy log line (after any syslog header), in
// the httplog format (`option httplog`) or the JSON log-format, and
// appends its one Attempt: HAProxy logs the server the request ended on
// (after retries and redispatch). A request no server took (<NOSRV>)
// appends none.
func ParseHAProxy(line []byte, out []Attempt) ([]Attempt, error) {
	if trimmed := bytes.TrimSpace(line); len(trimmed) > 0 && trimmed[0] == '{' {
		var l haproxyJSON
		if err := json.Unmarshal(trimmed, &l); err != nil {
			return out, fmt.Errorf("%w: %w", ErrBadLine, err)
		}
		var ts time.Time
		if sec, ok := seconds(string(l.Msec)); ok && sec > 0 && sec < 1e11 {
			// %Ts.%ms is the accept date: the outcome is known Ta later.
			ts = time.UnixMilli(int64(math.Round(sec * 1000))).UTC()
			if ta, err := strconv.Atoi(string(l.Ta)); err == nil && ta > 0 {
				ts = ts.Add(time.Duration(ta) * time.Millisecond)
			}
		}
		return haproxyAttempt(out, string(l.Backend), string(l.Server), string(l.Status),
			[5]string{string(l.TR), string(l.Tw), string(l.Tc), string(l.Tr), string(l.Ta)}, string(l.Termination), ts)
	}
	// httplog: client [accept_date] frontend backend/server TR/Tw/Tc/Tr/Ta
	// status bytes req_cookie res_cookie termination_state conns queues ...
	fields := strings.Fields(string(line))
	for i := 1; i+6 < len(fields); i++ {
		f := fields[i]
		if !strings.HasPrefix(f, "[") || !strings.HasSuffix(f, "]") || !strings.Contains(fields[i-1], ":") {
			continue
		}
		backend, server, ok := strings.Cut(fields[i+2], "/")
		timers := strings.Split(fields[i+3], "/")
		if !ok || len(timers) != 5 {
			return out, ErrBadLine
		}
		ts, _ := time.Parse("02/Jan/2006:15:04:05.000", strings.Trim(f, "[]"))
		term := ""
		if i+8 < len(fields) {
			term = fields[i+8]
		}
		// accept_date is when the request began: the outcome is known Ta
		// later.
		if ta, err := strconv.Atoi(timers[4]); err == nil && ta >= 0 && !ts.IsZero() {
			ts = ts.Add(time.Duration(ta) * time.Millisecond)
		}
		return haproxyAttempt(out, backend, server, fields[i+4], [5]string(timers), term, ts)
	}
	return out, ErrBadLine
}

// haproxyAttempt builds the Attempt of one HAProxy request from its
// timers (ms; -1 where a phase was not reached) and termination state.
func haproxyAttempt(out []Attempt, backend, server, status string, timers [5]string, term string, ts time.Time) ([]Attempt, error) {
	if backend == "" || server == "" {
		return out, ErrBadLine
	}
	if server == "<NOSRV>" || server == "-" {
		return out, nil
	}
	var t [5]int
	for k, v := range timers {
		n, err := strconv.Atoi(strings.TrimPrefix(v, "+"))
		if err != nil {
			return out, ErrBadLine
		}
		t[k] = n
	}
	a := Attempt{Upstream: backend + "/" + server, Group: backend, Backend: server, TS: ts}
	code, err := strconv.Atoi(status)
	if err != nil {
		return out, ErrBadLine
	}
	if code < 0 {
		code = 0
	}
	a.Status = code
	switch {
	case len(term) > 0 && (term[0] == 'C' || term[0] == 'c'):
		a.Status = 499 // the client aborted
	case len(term) > 0 && term[0] == 's':
		a.Status = 504 // the server timed out
	}
	// TR/Tw/Tc/Tr/Ta: Tr is the server's time to the response headers; the
	// time from sending the request to the last byte is Ta - TR - Tw - Tc.
	if t[3] >= 0 {
		a.TTFTMs, a.HasTTFT = float64(t[3]), true
	}
	if t[0] >= 0 && t[1] >= 0 && t[2] >= 0 && t[4] >= 0 && t[4] >= t[0]+t[1]+t[2] {
		a.DurationMs, a.HasDuration = float64(t[4]-t[0]-t[1]-t[2]), true
	}
	return append(out, a), nil
}

// LogSettings configure a LogIngester. Emitter and Metrics are required.
type LogSettings struct {
	// Format is AdapterNginx or AdapterHAProxy.
	Format string
	// Pool is the pool of lines that name none (no "pool" field); empty:
	// the proxy's upstream group (nginx's $proxy_host, the HAProxy
	// backend).
	Pool string
	// NoTTFT leaves ttft_ms out (ttft: none).
	NoTTFT  bool
	Mapping *Mapping
	Emitter *Emitter
	Metrics *Metrics
}

// LogIngester turns access log lines into published outcome events.
type LogIngester struct {
	s     LogSettings
	parse func([]byte, []Attempt) ([]Attempt, error)
}

// NewLogIngester returns the ingester of s.
func NewLogIngester(s LogSettings) (*LogIngester, error) {
	l := &LogIngester{s: s}
	switch s.Format {
	case AdapterNginx:
		l.parse = ParseNginx
	case AdapterHAProxy:
		l.parse = ParseHAProxy
	default:
		return nil, fmt.Errorf("ingest: unknown log format %q (want nginx or haproxy)", s.Format)
	}
	return l, nil
}

// Events appends the events of one line to b, counting what is skipped.
func (l *LogIngester) add(b *Batch, line []byte, scratch []Attempt) []Attempt {
	m := l.s.Metrics
	m.Requests.Inc()
	attempts, err := l.parse(line, scratch[:0])
	if err != nil {
		m.ParseErrors.Inc()
		return attempts
	}
	if len(attempts) == 0 {
		m.Skip(SkipNoUpstream)
		return attempts
	}
	var ev fleetwatch.Event
	for _, a := range attempts {
		// The line's pool field, else the configured pool, else the
		// proxy's upstream group.
		pool := a.Pool
		if pool == "" {
			pool = l.s.Pool
		}
		if pool == "" {
			pool = a.Group
		}
		var skip string
		ev = fleetwatch.Event{TS: a.TS, Status: a.Status, HasStatus: true}
		if ev.Pool, ev.Backend, skip = l.s.Mapping.Resolve(a.Upstream, pool, a.Backend); skip != "" {
			m.Skip(skip)
			continue
		}
		ev.Outcome = fleetwatch.OutcomeFromStatus(a.Status)
		if a.HasDuration {
			ev.DurationMs, ev.HasDuration = a.DurationMs, true
		}
		if a.HasTTFT && !l.s.NoTTFT && ev.Outcome == fleetwatch.OutcomeOK {
			ev.TTFTMs, ev.HasTTFT = a.TTFTMs, true
		}
		b.Add(&ev, 0)
	}
	return attempts
}

// Lines publishes the events of lines; an error (the publisher refused)
// means none of them should count as handled.
func (l *LogIngester) Lines(lines [][]byte) error {
	b := l.s.Emitter.NewBatch(l.s.Metrics)
	var scratch []Attempt
	for _, line := range lines {
		scratch = l.add(b, SyslogMessage(line), scratch)
	}
	_, err := b.Emit()
	return err
}

// LogRunSettings configure RunLog. Ingester is required, and at least one
// of File and Syslog.
type LogRunSettings struct {
	Ingester *LogIngester
	// File is followed with a Tailer (Tail holds its other settings).
	File string
	Tail TailSettings
	// Syslog receives syslog datagrams; RunLog closes it when it returns.
	Syslog *net.UDPConn
	// Flush bounds the wait for NATS to take a file batch before its
	// offset is saved. If zero, 5s.
	Flush time.Duration
	// Logf logs. If nil, nothing is logged.
	Logf func(format string, args ...any)
}

// ErrNoInput is returned by RunLog when neither a file nor a syslog socket
// is given.
var ErrNoInput = errors.New("ingest: no input: set a file or a syslog address")

// RunLog runs the log adapter until ctx ends: the file's lines and the
// syslog messages become events. A file's offset moves only once its
// lines' events are published and flushed, so a restart neither loses nor
// repeats them.
func RunLog(ctx context.Context, s LogRunSettings) error {
	if s.File == "" && s.Syslog == nil {
		return ErrNoInput
	}
	if s.Flush <= 0 {
		s.Flush = 5 * time.Second
	}
	logf := s.Logf
	if logf == nil {
		logf = func(string, ...any) {}
	}
	in := s.Ingester
	m := in.s.Metrics
	var wg sync.WaitGroup
	errs := make(chan error, 2)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	if s.Syslog != nil {
		wg.Go(func() {
			errs <- ServeSyslog(ctx, s.Syslog, func(msg []byte) {
				if err := in.Lines([][]byte{msg}); err != nil {
					logf("%v", err)
				}
			})
		})
	}
	if s.File != "" {
		ts := s.Tail
		ts.Path = s.File
		rotations := m.set.GetOrCreateCounter(fmt.Sprintf(`fleetwatch_ingest_tail_rotations_total{adapter=%q}`, m.adapter))
		truncations := m.set.GetOrCreateCounter(fmt.Sprintf(`fleetwatch_ingest_tail_truncations_total{adapter=%q}`, m.adapter))
		long := m.set.GetOrCreateCounter(fmt.Sprintf(`fleetwatch_ingest_tail_long_lines_total{adapter=%q}`, m.adapter))
		ts.OnRotate = func() { rotations.Inc(); logf("%s was rotated: following the new file", s.File) }
		ts.OnTruncate = func() { truncations.Inc(); logf("%s was truncated: reading it from its start", s.File) }
		ts.OnLongLine = long.Inc
		wg.Go(func() {
			errs <- NewTailer(ts).Run(ctx, func(lines [][]byte) error {
				if err := in.Lines(lines); err != nil {
					logf("%v", err)
					return err
				}
				if err := in.s.Emitter.Flush(s.Flush); err != nil {
					logf("%v", err)
					return err
				}
				return nil
			})
		})
	}
	var first error
	select {
	case <-ctx.Done():
	case first = <-errs:
	}
	cancel()
	wg.Wait()
	return first
}
