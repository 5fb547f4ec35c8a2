package sim

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/fleetwatch/fleetwatch"
	"github.com/fleetwatch/fleetwatch/internal/ingest"
)

// Trace formats ReadTrace reads (fleetwatch sim --trace, --format).
const (
	// FormatAzure is a CSV with a header naming a timestamp column and the
	// prompt and output token columns, as the Azure LLM inference traces
	// (TIMESTAMP,ContextTokens,GeneratedTokens).
	FormatAzure = "azure-csv"
	// FormatMooncake is JSON lines with timestamp (ms from the trace's
	// start), input_length, output_length and hash_ids (ids of the
	// prompt's BlockTokens-token blocks), as Mooncake's traces.
	FormatMooncake = "mooncake-jsonl"
	// FormatOutcomes is fleetwatch outcome events as NDJSON (fw.outcomes).
	FormatOutcomes = "outcomes-ndjson"
	// FormatNginx is nginx access log lines in the JSON log_format of
	// docs/INTEGRATIONS.md, read by the ingest parser.
	FormatNginx = "nginx-json"
)

// TraceFormats lists the formats, for the command's help.
var TraceFormats = []string{FormatAzure, FormatMooncake, FormatOutcomes, FormatNginx}

// BlockTokens is the tokens of one KV block: Mooncake's hash_ids are of
// 512-token blocks, and the simulated KV cache uses the same size.
const BlockTokens = 512

// Token counts assumed for a request whose record has none (nginx logs
// always; outcome events without input_tokens/output_tokens): a prompt
// about the Azure conversation trace's median, and an output of the
// streamed time after the first token at traceDecodeMs per token (or
// traceOutputDefault without timings). Each such request is counted in
// Trace.Defaulted.
const (
	tracePromptDefault = 1000
	traceOutputDefault = 200
	traceDecodeMs      = 5
)

// TraceRequest is one request of a trace.
type TraceRequest struct {
	At           time.Duration // arrival, from the trace's first request
	PromptTokens int
	OutputTokens int
	// Blocks are the prompt's KV blocks as prefix keys (chainBlocks); nil
	// when the record carries no prefix information.
	Blocks []uint64
}

// Trace is a per-request trace to replay (Scenario.Trace).
type Trace struct {
	Name     string // the file
	Format   string
	Requests []TraceRequest // by arrival
	Span     time.Duration  // first to last arrival
	Lines    int            // non-blank lines read, header included
	// Skipped counts the lines that could not be read, by reason.
	Skipped map[string]int
	// Defaulted counts the requests whose token counts were assumed.
	Defaulted int
}

// SkippedTotal is the number of lines skipped.
func (t *Trace) SkippedTotal() int {
	n := 0
	for _, c := range t.Skipped {
		n += c
	}
	return n
}

// SkippedSummary is "reason: n, ..." by reason, or "none".
func (t *Trace) SkippedSummary() string {
	if len(t.Skipped) == 0 {
		return "none"
	}
	var parts []string
	for _, r := range slices.Sorted(mapsKeys(t.Skipped)) {
		parts = append(parts, fmt.Sprintf("%s: %d", r, t.Skipped[r]))
	}
	return strings.Join(parts, ", ")
}

func mapsKeys(m map[string]int) func(func(string) bool) {
	return func(yield func(string) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

// ReadTraceFile reads the trace in path (format "" detects it).
func ReadTraceFile(path, format string) (*Trace, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return ReadTrace(f, path, format)
}

// ReadTrace reads a trace in format (one of TraceFormats; "" detects it from
// the first line: a CSV header, or the keys of a JSON object). A line that
// cannot be read is skipped and counted by reason in Trace.Skipped; a trace
// without any usable request is an error naming name.
func ReadTrace(r io.Reader, name, format string) (*Trace, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), 64<<20)
	var lines [][]byte
	for sc.Scan() {
		line := bytes.TrimRight(sc.Bytes(), "\r")
		if len(lines) == 0 {
			line = bytes.TrimPrefix(line, []byte("\xef\xbb\xbf"))
		}
		if len(bytes.TrimSpace(line)) == 0 {
			continue
		}
		lines = append(lines, slices.Clone(line))
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("sim: %s: %w", name, err)
	}
	if len(lines) == 0 {
		return nil, fmt.Errorf("sim: %s: no usable request (empty file)", name)
	}
	if format == "" {
		var err error
		if format, err = detectFormat(lines[0]); err != nil {
			return nil, fmt.Errorf("sim: %s: %w (set --format)", name, err)
		}
	}
	t := &Trace{Name: name, Format: format, Lines: len(lines), Skipped: map[string]int{}}
	var at []float64 // ms, absolute in the trace's clock
	add := func(ms float64, req TraceRequest) {
		at = append(at, ms)
		t.Requests = append(t.Requests, req)
	}
	var err error
	switch format {
	case FormatAzure:
		err = readCSV(t, lines, add)
	case FormatMooncake:
		readMooncake(t, lines, add)
	case FormatOutcomes:
		readOutcomes(t, lines, add)
	case FormatNginx:
		readNginx(t, lines, add)
	default:
		return nil, fmt.Errorf("sim: unknown trace format %q (one of %s)", format, strings.Join(TraceFormats, ", "))
	}
	if err != nil {
		return nil, fmt.Errorf("sim: %s: %w", name, err)
	}
	if len(t.Requests) == 0 {
		return nil, fmt.Errorf("sim: %s: no usable request in %d lines (skipped: %s)", name, t.Lines, t.SkippedSummary())
	}
	order := make([]int, len(at))
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int {
		switch {
		case at[a] < at[b]:
			return -1
		case at[a] > at[b]:
			return 1
		}
		return 0
	})
	sorted := make([]TraceRequest, len(order))
	first := at[order[0]]
	for i, j := range order {
		sorted[i] = t.Requests[j]
		sorted[i].At = dur(at[j] - first)
	}
	t.Requests = sorted
	t.Span = sorted[len(sorted)-1].At
	return t, nil
}

// detectFormat guesses a trace's format from its first line.
func detectFormat(line []byte) (string, error) {
	line = bytes.TrimSpace(line)
	if len(line) > 0 && line[0] != '{' {
		if i := bytes.IndexByte(line, '{'); i > 0 && bytes.Contains(line[i:], []byte(`"upstream_addr"`)) {
			return FormatNginx, nil // a syslog header before the JSON
		}
		if bytes.IndexByte(line, ',') > 0 {
			return FormatAzure, nil
		}
		return "", errors.New("cannot detect the trace format from the first line")
	}
	var keys map[string]json.RawMessage
	if err := json.Unmarshal(line, &keys); err != nil {
		return "", fmt.Errorf("cannot detect the trace format: first line: %w", err)
	}
	has := func(k string) bool { _, ok := keys[k]; return ok }
	switch {
	case has("input_length") || has("hash_ids"):
		return FormatMooncake, nil
	case has("upstream_addr") || has("upstream_status"):
		return FormatNginx, nil
	case has("pool") && has("backend"):
		return FormatOutcomes, nil
	}
	return "", errors.New("cannot detect the trace format: the first object has none of the known keys")
}

// CSV columns, by lower-cased header name.
var (
	csvTimeColumns   = []string{"timestamp", "time", "ts", "arrival_time", "arrival_timestamp"}
	csvPromptColumns = []string{"contexttokens", "context_tokens", "prompt_tokens", "input_tokens", "input_length", "request_tokens"}
	csvOutputColumns = []string{"generatedtokens", "generated_tokens", "output_tokens", "completion_tokens", "output_length", "response_tokens"}
)

// csvTimeLayouts are the timestamp forms a CSV trace may use (besides a
// number of seconds).
var csvTimeLayouts = []string{"2006-01-02 15:04:05.999999999", time.RFC3339Nano, "2006-01-02T15:04:05.999999999", "2006-01-02 15:04:05.999999999Z07:00"}

func readCSV(t *Trace, lines [][]byte, add func(float64, TraceRequest)) error {
	header := strings.Split(string(lines[0]), ",")
	col := func(names []string) int {
		for i, h := range header {
			if slices.Contains(names, strings.ToLower(strings.Trim(strings.TrimSpace(h), `"`))) {
				return i
			}
		}
		return -1
	}
	tc, pc, oc := col(csvTimeColumns), col(csvPromptColumns), col(csvOutputColumns)
	switch {
	case tc < 0:
		return fmt.Errorf("CSV header %q has no timestamp column (%s)", lines[0], strings.Join(csvTimeColumns, ", "))
	case pc < 0:
		return fmt.Errorf("CSV header %q has no prompt tokens column (%s)", lines[0], strings.Join(csvPromptColumns, ", "))
	case oc < 0:
		return fmt.Errorf("CSV header %q has no output tokens column (%s)", lines[0], strings.Join(csvOutputColumns, ", "))
	}
	for _, line := range lines[1:] {
		f := strings.Split(string(line), ",")
		if len(f) != len(header) {
			t.Skipped["wrong number of fields"]++
			continue
		}
		ms, ok := parseTraceTime(strings.Trim(strings.TrimSpace(f[tc]), `"`))
		if !ok {
			t.Skipped["bad timestamp"]++
			continue
		}
		p, perr := strconv.Atoi(strings.TrimSpace(f[pc]))
		o, oerr := strconv.Atoi(strings.TrimSpace(f[oc]))
		if perr != nil || oerr != nil || p < 0 || o < 0 {
			t.Skipped["bad token count"]++
			continue
		}
		add(ms, TraceRequest{PromptTokens: p, OutputTokens: o})
	}
	return nil
}

// parseTraceTime reads a timestamp as ms: a number of seconds, or a date and
// time in one of csvTimeLayouts (UTC when it has no zone).
func parseTraceTime(s string) (float64, bool) {
	if v, err := strconv.ParseFloat(s, 64); err == nil {
		if math.IsNaN(v) || math.IsInf(v, 0) {
			return 0, false
		}
		return v * 1000, true
	}
	for _, layout := range csvTimeLayouts {
		if ts, err := time.Parse(layout, s); err == nil {
			return float64(ts.UnixNano()) / 1e6, true
		}
	}
	return 0, false
}

// mooncakeLine is one record of a Mooncake trace.
type mooncakeLine struct {
	Timestamp    *float64 `json:"timestamp"`
	InputLength  *int64   `json:"input_length"`
	OutputLength *int64   `json:"output_length"`
	HashIDs      []uint64 `json:"hash_ids"`
}

func readMooncake(t *Trace, lines [][]byte, add func(float64, TraceRequest)) {
	for _, line := range lines {
		var l mooncakeLine
		if err := json.Unmarshal(line, &l); err != nil {
			t.Skipped["bad json"]++
			continue
		}
		switch {
		case l.Timestamp == nil || math.IsNaN(*l.Timestamp) || *l.Timestamp < 0:
			t.Skipped["missing or bad timestamp"]++
			continue
		case l.InputLength == nil || *l.InputLength < 0 || l.OutputLength == nil || *l.OutputLength < 0:
			t.Skipped["missing or bad input_length/output_length"]++
			continue
		}
		req := TraceRequest{PromptTokens: int(*l.InputLength), OutputTokens: int(*l.OutputLength)}
		if len(l.HashIDs) > 0 {
			req.Blocks = chainBlocks(l.HashIDs)
		}
		add(*l.Timestamp, req)
	}
}

func readOutcomes(t *Trace, lines [][]byte, add func(float64, TraceRequest)) {
	var d fleetwatch.Decoder
	var ev fleetwatch.Event
	for _, line := range lines {
		ev = fleetwatch.Event{}
		if err := d.Decode(line, &ev); err != nil {
			reason := "bad event"
			var de *fleetwatch.DecodeError
			if errors.As(err, &de) {
				reason = de.Err.Error()
				if de.Field != "" {
					reason += " (" + de.Field + ")"
				}
			}
			t.Skipped[reason]++
			continue
		}
		if ev.TS.IsZero() {
			t.Skipped["no ts"]++
			continue
		}
		// ts is when the outcome became known: the request arrived its
		// duration earlier.
		at := float64(ev.TS.UnixNano()) / 1e6
		if ev.HasDuration {
			at -= ev.DurationMs
		}
		req := TraceRequest{PromptTokens: int(ev.InputTokens), OutputTokens: int(ev.OutputTokens)}
		if req.PromptTokens == 0 && req.OutputTokens == 0 {
			req.PromptTokens, req.OutputTokens = tracePromptDefault, outputFromTimes(ev.HasTTFT && ev.HasDuration, ev.DurationMs-ev.TTFTMs)
			t.Defaulted++
		}
		if ev.Prefix != "" {
			req.Blocks = prefixBlock(ev.Prefix)
		}
		add(at, req)
	}
}

// prefixBlock is a record's prefix hash as one KV block: the record says
// which requests share a prefix, not how long it is.
func prefixBlock(prefix string) []uint64 {
	h := fnv.New64a()
	h.Write([]byte(prefix))
	return chainBlocks([]uint64{h.Sum64()})
}

// outputFromTimes is the output tokens of a stream that took streamMs after
// its first token, at traceDecodeMs per token (traceOutputDefault when the
// times are not known).
func outputFromTimes(known bool, streamMs float64) int {
	if !known || streamMs <= 0 {
		return traceOutputDefault
	}
	return max(1, int(math.Round(streamMs/traceDecodeMs)))
}

func readNginx(t *Trace, lines [][]byte, add func(float64, TraceRequest)) {
	var atts []ingest.Attempt
	for _, line := range lines {
		var err error
		atts, err = ingest.ParseNginx(line, atts[:0])
		switch {
		case err != nil:
			t.Skipped["not an nginx JSON line"]++
			continue
		case len(atts) == 0:
			t.Skipped["no upstream"]++
			continue
		case atts[0].TS.IsZero():
			t.Skipped["no msec"]++
			continue
		}
		// msec is when the line was written: the request arrived the sum of
		// its attempts' times earlier.
		at := float64(atts[0].TS.UnixNano()) / 1e6
		for _, a := range atts {
			if a.HasDuration {
				at -= a.DurationMs
			}
		}
		last := atts[len(atts)-1]
		out := outputFromTimes(last.HasTTFT && last.HasDuration, last.DurationMs-last.TTFTMs)
		t.Defaulted++
		add(at, TraceRequest{PromptTokens: tracePromptDefault, OutputTokens: out})
	}
}
