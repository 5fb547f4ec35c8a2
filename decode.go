package fleetwatch

import (
	"bytes"
	"math"
	"time"
	"unicode/utf8"
)

// Decoder decodes outcome events (PROTOCOL.md "Outcome event") with a
// hand-written scanner over the input bytes: it is the collector's hot path,
// and encoding/json spends most of its time in reflection and allocation.
//
// A Decoder interns the pool, backend, fingerprint, source and prefix
// strings it has seen, each kind in its own bounded table, so that decoding
// an event whose strings it has seen before allocates nothing, and a string
// found in a table skips validation (only valid strings are entered). The
// zero value is ready to use. A Decoder is not safe for concurrent use: give
// each goroutine its own.
//
// Decoding rules beyond the letter of PROTOCOL.md (docs/PROTOCOL.md records
// them):
//   - Field names are case-sensitive; unknown fields are skipped (their value
//     must still be valid JSON). When a key repeats, the last value wins.
//   - JSON null for any field means the field is absent. For pool and
//     backend that is ErrMissingField.
//   - status, input_tokens and output_tokens must be written as integers
//     (no fraction, no exponent); 1.0 is ErrWrongType.
//   - v must be the number 1 when present: another number is ErrBadVersion,
//     another type ErrWrongType.
//   - An event with neither outcome nor status gets OutcomeFromStatus(0),
//     that is timeout: an absent status means 0, "no answer came".
//   - A backend id longer than 256 bytes is ErrInvalidBackend (like any
//     other invalid backend id), a pool id longer than 256 bytes
//     ErrInvalidPool; prefix, fingerprint and source beyond their bounds are
//     ErrTooLong. Lengths count bytes after unescaping.
//   - stream_error (at most 64 bytes) and model_mismatch (at most 256) are
//     free-form strings under the same rules as source: stream_error is not
//     checked against the values this version writes, so that a newer
//     proxy's reason is carried rather than rejected.
//   - prefix, fingerprint and source must be valid UTF-8 (ErrBadValue); pool
//     and backend ids follow ValidatePoolID and ValidateBackendID.
//   - ts is truncated to the millisecond (the protocol's precision) and
//     converted to UTC; a time whose UTC year is outside 0000..9999 cannot be
//     written back in RFC 3339 and is ErrBadValue. The zero time.Time means
//     "absent", so "0001-01-01T00:00:00Z" reads as an absent ts.
//   - Nesting of skipped values deeper than 10000 is ErrBadJSON, as in
//     encoding/json.
type Decoder struct {
	tables [numTables]internTable
	buf    []byte // scratch for strings with escapes
	// fieldErrs holds the failure of each field of the object being
	// decoded, until a later duplicate key replaces it.
	fieldErrs [numFields]failure
	batch     Event // the event DecodeBatch passes to its callback
}

const maxNesting = 10000

// Interned string tables, one per kind of string, so that a hit in a table
// means the string passed that kind's validation.
const (
	tablePool = iota
	tableBackend
	tableFingerprint
	tableSource
	tablePrefix
	tableStreamError
	tableModel
	tableShed
	numTables
)

// Bounds of one internTable: at most 2 MiB of strings each, plus the map.
const (
	maxInterned      = 65536
	maxInternedBytes = 2 << 20
)

// internTable maps a string to the one string value holding it. When it
// reaches maxInterned entries or maxInternedBytes it starts afresh, so that
// ids of backends that went away, or a flood of distinct prefixes, do not
// stay pinned forever; the ids still in use are entered again as they recur.
type internTable struct {
	m     map[string]string
	bytes int
	last  string // the last string found or entered, checked before m
}

// lookup returns the interned string equal to s. Neither the comparison nor
// the map lookup with string(s) as key allocates.
func (t *internTable) lookup(s []byte) (string, bool) {
	if len(s) > 0 && t.last == string(s) {
		return t.last, true
	}
	if v, ok := t.m[string(s)]; ok {
		t.last = v
		return v, true
	}
	return "", false
}

// add enters s, which lookup did not find, and returns it as a string.
func (t *internTable) add(s []byte) string {
	v := string(s)
	if t.m == nil || len(t.m) >= maxInterned || t.bytes+len(v) > maxInternedBytes {
		if t.m == nil {
			t.m = make(map[string]string, 64)
		} else {
			clear(t.m)
		}
		t.bytes = 0
	}
	t.m[v] = v
	t.bytes += len(v)
	t.last = v
	return v
}

// field numbers the known fields of an outcome event, in protocol order.
type field uint8

const (
	fieldV field = iota
	fieldPool
	fieldBackend
	fieldTS
	fieldStatus
	fieldOutcome
	fieldTTFT
	fieldDuration
	fieldInputTokens
	fieldOutputTokens
	fieldCold
	fieldRetryAfter
	fieldPrefix
	fieldCacheHit
	fieldFingerprint
	fieldSource
	fieldRunning
	fieldWaiting
	fieldKVCache
	fieldStreamError
	fieldModelMismatch
	fieldToolCallBroken
	fieldFakeStream
	fieldQuotaReset
	fieldShed
	numFields
	noField = numFields
)

var fieldNames = [numFields]string{
	fieldV: "v", fieldPool: "pool", fieldBackend: "backend", fieldTS: "ts",
	fieldStatus: "status", fieldOutcome: "outcome", fieldTTFT: "ttft_ms",
	fieldDuration: "duration_ms", fieldInputTokens: "input_tokens",
	fieldOutputTokens: "output_tokens", fieldCold: "cold",
	fieldRetryAfter: "retry_after_ms", fieldPrefix: "prefix",
	fieldCacheHit: "cache_hit", fieldFingerprint: "fingerprint", fieldSource: "source",
	fieldRunning: "running", fieldWaiting: "waiting", fieldKVCache: "kv_cache_usage",
	fieldStreamError: "stream_error", fieldModelMismatch: "model_mismatch",
	fieldToolCallBroken: "tool_call_broken", fieldFakeStream: "fake_stream",
	fieldQuotaReset: "quota_reset_ms", fieldShed: "shed",
}

// fieldOf returns the field named key, noField for an unknown key. It is
// the slow path behind knownKey, for unknown keys and keys with escapes.
func fieldOf(key []byte) field {
	for k, name := range fieldNames {
		if string(key) == name { // compares lengths first; no allocation
			return field(k)
		}
	}
	return noField
}

// keysByFirstByte lists the known fields by the first byte of their name.
var keysByFirstByte = func() (t [256][]field) {
	for k := range numFields {
		c := fieldNames[k][0]
		t[c] = append(t[c], k)
	}
	return t
}()

// knownKey matches the key whose opening quote is data[pos] against the
// known field names directly, sparing a scan and a lookup for the keys of a
// typical event. It returns the field and the offset just past the closing
// quote, or next == 0 when the key is not a known name written plainly.
func knownKey(data []byte, pos int) (k field, next int) {
	if pos+1 >= len(data) {
		return noField, 0
	}
	for _, k := range keysByFirstByte[data[pos+1]] {
		name := fieldNames[k]
		end := pos + 1 + len(name)
		if end < len(data) && data[end] == '"' && string(data[pos+1:end]) == name {
			return k, end + 1
		}
	}
	return noField, 0
}

// failure is a decode error before it becomes a *DecodeError, so that the
// success path allocates nothing. err == nil means no failure.
type failure struct {
	err   error
	field field
	off   int
}

func syntaxError(off int) failure { return failure{err: ErrBadJSON, field: noField, off: off} }

func (d *Decoder) errorOf(f failure, base int, ev *Event) *DecodeError {
	e := &DecodeError{Err: f.err, Offset: f.off - base, Source: ev.Source}
	if f.field < numFields {
		e.Field = fieldNames[f.field]
	}
	return e
}

// Decode decodes data, which must hold exactly one JSON object (surrounded
// by whitespace or not), into ev, overwriting all of ev. An error is a
// *DecodeError wrapping one of the sentinel errors of reject.go; ev is then
// only partly filled.
func (d *Decoder) Decode(data []byte, ev *Event) error {
	start := skipSpace(data, 0)
	end, f := d.object(data, start, ev)
	if f.err != ErrBadJSON {
		if rest := skipSpace(data, end); rest != len(data) {
			f = syntaxError(rest)
		}
	}
	if f.err != nil {
		return d.errorOf(f, 0, ev)
	}
	return nil
}

// DecodeBatch decodes a payload that is either one JSON object, which may
// span lines (a pretty-printed event), or NDJSON: objects one per line,
// blank lines skipped. It calls fn once per object or bad line, in order,
// with the object's bytes, the decoded event and nil, or with the bad line,
// a partly filled event and a *DecodeError whose Offset counts from the
// start of line. A bad line rejects that line alone; two objects on one
// line make a bad line.
//
// ev and line are only valid during the call: ev is reused for the next
// one. Every line is scanned at most twice, so a hostile payload (say,
// thousands of lines that each open an array) costs time linear in its
// size.
func (d *Decoder) DecodeBatch(data []byte, fn func(line []byte, ev *Event, err error)) (ok, bad int) {
	ev := &d.batch
	// report passes on the result for line, which starts at data[base]
	// (line's own offset 0 when base is 0).
	report := func(line []byte, base int, f failure) {
		if f.err == nil {
			ok++
			fn(line, ev, nil)
			return
		}
		if f.off-base > len(line) { // past trailing blanks the line does not show
			f.off = base + len(line)
		}
		bad++
		fn(line, ev, d.errorOf(f, base, ev))
	}

	start := skipSpace(data, 0)
	if start == len(data) {
		return 0, 0
	}
	// Try the whole payload as one object first: that is the only way an
	// object may span lines.
	end, f := d.object(data, start, ev)
	lineEnd := len(data)
	if i := bytes.IndexByte(data[start:], '\n'); i >= 0 {
		lineEnd = start + i
	}
	next := 0 // where NDJSON decoding starts
	switch {
	case f.err != ErrBadJSON && skipSpace(data, end) == len(data):
		report(data[start:end], start, f)
		return ok, bad
	case f.err != ErrBadJSON && end <= lineEnd && onlyBlanks(data[end:lineEnd]):
		// The first line of NDJSON: keep its result.
		report(data[start:end], start, f)
		next = lineEnd + 1
	}

	for next < len(data) {
		lineEnd := len(data)
		if i := bytes.IndexByte(data[next:], '\n'); i >= 0 {
			lineEnd = next + i
		}
		line := bytes.Trim(data[next:lineEnd], " \t\r")
		next = lineEnd + 1
		if len(line) == 0 {
			continue
		}
		end, f := d.object(line, 0, ev)
		if f.err != ErrBadJSON && end != len(line) {
			f = syntaxError(skipSpace(line, end))
		}
		report(line, 0, f)
	}
	return ok, bad
}

// onlyBlanks reports whether b holds nothing but spaces, tabs and carriage
// returns.
func onlyBlanks(b []byte) bool {
	for _, c := range b {
		if c != ' ' && c != '\t' && c != '\r' {
			return false
		}
	}
	return true
}

// object decodes the object at data[pos:] into ev. It returns the offset
// just past the closing brace, and the failure if any. A syntax failure
// (ErrBadJSON) returns at once; a field failure is held until the object
// ends, because a later duplicate key may replace the value, and the one at
// the smallest offset is returned.
func (d *Decoder) object(data []byte, pos int, ev *Event) (int, failure) {
	*ev = Event{}
	// fieldErrs[k] is meaningful only where bit k of errMask is set, which
	// spares zeroing the array for every event.
	fieldErrs := &d.fieldErrs
	var errMask uint32
	objStart := pos
	if pos >= len(data) || data[pos] != '{' {
		return pos, syntaxError(pos)
	}
	pos = skipSpace(data, pos+1)
	if pos < len(data) && data[pos] == '}' {
		pos++
	} else {
		for {
			if pos >= len(data) || data[pos] != '"' {
				return pos, syntaxError(pos)
			}
			k, next := knownKey(data, pos)
			if next == 0 { // an unknown key, or one with escapes
				var key []byte
				var ok bool
				key, next, ok = d.readString(data, pos)
				if !ok {
					return next, syntaxError(next)
				}
				k = fieldOf(key)
			}
			pos = skipSpace(data, next)
			if pos >= len(data) || data[pos] != ':' {
				return pos, syntaxError(pos)
			}
			pos = skipSpace(data, pos+1)
			var fe failure
			if k == noField {
				var ok bool
				pos, ok = skipValue(data, pos, 0)
				if !ok {
					return pos, syntaxError(pos)
				}
			} else {
				fe, pos = d.value(data, pos, k, ev)
				switch fe.err {
				case nil:
					errMask &^= 1 << k
				case ErrBadJSON:
					return pos, fe
				default:
					errMask |= 1 << k
					fieldErrs[k] = fe
				}
			}
			pos = skipSpace(data, pos)
			if pos >= len(data) {
				return pos, syntaxError(pos)
			}
			if data[pos] == '}' {
				pos++
				break
			}
			if data[pos] != ',' {
				return pos, syntaxError(pos)
			}
			pos = skipSpace(data, pos+1)
		}
	}
	if errMask != 0 {
		first := failure{off: math.MaxInt}
		for k, fe := range fieldErrs {
			if errMask&(1<<k) != 0 && fe.off < first.off {
				first = fe
			}
		}
		return pos, first
	}
	switch {
	case ev.Pool == "":
		return pos, failure{err: ErrMissingField, field: fieldPool, off: objStart}
	case ev.Backend == "":
		return pos, failure{err: ErrMissingField, field: fieldBackend, off: objStart}
	}
	if ev.Outcome == OutcomeUnset {
		ev.Outcome = OutcomeFromStatus(ev.Status)
	}
	return pos, failure{}
}

// value decodes the value at data[pos:] of known field k into ev. It
// returns the field's failure (ErrBadJSON for a syntax error) and the offset
// just past the value. A null value resets the field to absent.
func (d *Decoder) value(data []byte, pos int, k field, ev *Event) (failure, int) {
	if pos >= len(data) {
		return syntaxError(pos), pos
	}
	fail := func(err error) failure { return failure{err: err, field: k, off: pos} }
	c := data[pos]
	if c == 'n' {
		end, ok := literal(data, pos, "null")
		if !ok {
			return syntaxError(end), end
		}
		clearField(ev, k)
		return failure{}, end
	}
	switch k {
	case fieldPool, fieldBackend, fieldTS, fieldOutcome, fieldPrefix, fieldFingerprint, fieldSource,
		fieldStreamError, fieldModelMismatch, fieldShed:
		if c != '"' {
			return wrongType(data, pos, k)
		}
		s, end, ok := d.readString(data, pos)
		if !ok {
			return syntaxError(end), end
		}
		if err := d.setString(ev, k, s); err != nil {
			return fail(err), end
		}
		return failure{}, end

	case fieldCold, fieldCacheHit, fieldToolCallBroken, fieldFakeStream:
		var v bool
		var end int
		var ok bool
		switch c {
		case 't':
			end, ok = literal(data, pos, "true")
			v = true
		case 'f':
			end, ok = literal(data, pos, "false")
		default:
			return wrongType(data, pos, k)
		}
		if !ok {
			return syntaxError(end), end
		}
		setBool(ev, k, v)
		return failure{}, end
	}

	// The remaining fields are numbers.
	if c != '-' && (c < '0' || c > '9') {
		return wrongType(data, pos, k)
	}
	var n number
	ok := scanNumber(data, pos, &n)
	end := n.end
	if !ok {
		return syntaxError(end), end
	}
	num := data[pos:end]
	switch k {
	case fieldV:
		if f, ok := n.float(num); !ok || f != 1 {
			return fail(ErrBadVersion), end
		}
	case fieldStatus:
		if !n.isInt {
			return fail(ErrWrongType), end
		}
		v, ok := n.integer()
		if !ok || v < 0 || v > 999 {
			return fail(ErrOutOfRange), end
		}
		ev.Status, ev.HasStatus = int(v), true
	case fieldInputTokens, fieldOutputTokens, fieldRunning, fieldWaiting:
		if !n.isInt {
			return fail(ErrWrongType), end
		}
		v, ok := n.integer()
		if !ok || v < 0 {
			return fail(ErrOutOfRange), end
		}
		setCount(ev, k, v)
	case fieldKVCache:
		f, ok := n.float(num)
		if !ok || !(f >= 0 && f <= 1) { // NaN fails both
			return fail(ErrOutOfRange), end
		}
		ev.KVCacheUsage, ev.HasKVCache = f, true
	case fieldTTFT, fieldDuration, fieldRetryAfter, fieldQuotaReset:
		f, ok := n.float(num)
		if !ok || !(f >= 0 && f <= durationLimit(k)) { // NaN fails both
			return fail(ErrOutOfRange), end
		}
		setDuration(ev, k, f)
	}
	return failure{}, end
}

// wrongType skips the value at pos, of the wrong JSON type for field k, and
// reports it (a syntax error when the value is not even JSON).
func wrongType(data []byte, pos int, k field) (failure, int) {
	end, ok := skipValue(data, pos, 0)
	if !ok {
		return syntaxError(end), end
	}
	return failure{err: ErrWrongType, field: k, off: pos}, end
}

// setBool, setCount and setDuration store a checked value of field k
// (small enough to be inlined into value).
func setBool(ev *Event, k field, v bool) {
	switch k {
	case fieldCold:
		ev.Cold = v
	case fieldCacheHit:
		ev.CacheHit = v
	case fieldToolCallBroken:
		ev.ToolCallBroken = v
	default:
		ev.FakeStream = v
	}
}

func setCount(ev *Event, k field, v int64) {
	switch k {
	case fieldInputTokens:
		ev.InputTokens = v
	case fieldOutputTokens:
		ev.OutputTokens = v
	case fieldRunning:
		ev.Running, ev.HasRunning = v, true
	default:
		ev.Waiting, ev.HasWaiting = v, true
	}
}

func setDuration(ev *Event, k field, f float64) {
	switch k {
	case fieldTTFT:
		ev.TTFTMs, ev.HasTTFT = f, true
	case fieldDuration:
		ev.DurationMs, ev.HasDuration = f, true
	case fieldQuotaReset:
		ev.QuotaResetMs = f
	default:
		ev.RetryAfterMs = f
	}
}

// durationLimit is the largest value of duration field k: an hour, or 30
// days for quota_reset_ms.
func durationLimit(k field) float64 {
	if k == fieldQuotaReset {
		return MaxQuotaResetMs
	}
	return MaxDurationMs
}

// setString validates and stores the string value s of field k.
func (d *Decoder) setString(ev *Event, k field, s []byte) error {
	switch k {
	case fieldPool:
		t := &d.tables[tablePool]
		v, ok := t.lookup(s)
		if !ok {
			if !validPoolID(s) {
				ev.Pool = ""
				return ErrInvalidPool
			}
			v = t.add(s)
		}
		ev.Pool = v
	case fieldBackend:
		t := &d.tables[tableBackend]
		v, ok := t.lookup(s)
		if !ok {
			if !validBackendID(s) {
				ev.Backend = ""
				return ErrInvalidBackend
			}
			v = t.add(s)
		}
		ev.Backend = v
	case fieldTS:
		t, ok := parseTime(s)
		if !ok {
			return ErrBadValue
		}
		ev.TS = t
	case fieldOutcome:
		o, ok := parseOutcome(s)
		if !ok {
			return ErrBadValue
		}
		ev.Outcome = o
	case fieldPrefix:
		v, err := d.boundedString(tablePrefix, s, MaxPrefixLen)
		if err != nil {
			return err
		}
		ev.Prefix = v
	case fieldFingerprint:
		v, err := d.boundedString(tableFingerprint, s, MaxFingerprintLen)
		if err != nil {
			return err
		}
		ev.Fingerprint = v
	case fieldSource:
		v, err := d.boundedString(tableSource, s, MaxSourceLen)
		if err != nil {
			return err
		}
		ev.Source = v
	case fieldStreamError:
		v, err := d.boundedString(tableStreamError, s, MaxStreamErrorLen)
		if err != nil {
			return err
		}
		ev.StreamError = v
	case fieldModelMismatch:
		v, err := d.boundedString(tableModel, s, MaxModelLen)
		if err != nil {
			return err
		}
		ev.ModelMismatch = v
	case fieldShed:
		v, err := d.boundedString(tableShed, s, MaxShedLen)
		if err != nil {
			return err
		}
		ev.Shed = v
	}
	return nil
}

// boundedString validates and interns a free-form string of at most max
// bytes of valid UTF-8.
func (d *Decoder) boundedString(table int, s []byte, max int) (string, error) {
	t := &d.tables[table]
	if v, ok := t.lookup(s); ok {
		return v, nil
	}
	if len(s) > max {
		return "", ErrTooLong
	}
	if !utf8.Valid(s) {
		return "", ErrBadValue
	}
	if len(s) == 0 {
		return "", nil
	}
	return t.add(s), nil
}

func clearField(ev *Event, k field) {
	switch k {
	case fieldPool:
		ev.Pool = ""
	case fieldBackend:
		ev.Backend = ""
	case fieldTS:
		ev.TS = time.Time{}
	case fieldStatus:
		ev.Status, ev.HasStatus = 0, false
	case fieldOutcome:
		ev.Outcome = OutcomeUnset
	case fieldTTFT:
		ev.TTFTMs, ev.HasTTFT = 0, false
	case fieldDuration:
		ev.DurationMs, ev.HasDuration = 0, false
	case fieldInputTokens:
		ev.InputTokens = 0
	case fieldOutputTokens:
		ev.OutputTokens = 0
	case fieldCold:
		ev.Cold = false
	case fieldRetryAfter:
		ev.RetryAfterMs = 0
	case fieldPrefix:
		ev.Prefix = ""
	case fieldCacheHit:
		ev.CacheHit = false
	case fieldFingerprint:
		ev.Fingerprint = ""
	case fieldSource:
		ev.Source = ""
	case fieldRunning:
		ev.Running, ev.HasRunning = 0, false
	case fieldWaiting:
		ev.Waiting, ev.HasWaiting = 0, false
	case fieldKVCache:
		ev.KVCacheUsage, ev.HasKVCache = 0, false
	case fieldStreamError:
		ev.StreamError = ""
	case fieldModelMismatch:
		ev.ModelMismatch = ""
	case fieldToolCallBroken:
		ev.ToolCallBroken = false
	case fieldFakeStream:
		ev.FakeStream = false
	case fieldQuotaReset:
		ev.QuotaResetMs = 0
	case fieldShed:
		ev.Shed = ""
	}
}
