package fleetwatch

import (
	"bytes"
	"math"
	"strconv"
	"time"
	"unicode/utf16"
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
	case fieldPool, fieldBackend, fieldTS, fieldOutcome, fieldPrefix, fieldFingerprint, fieldSource:
		if c != '"' {
			end, ok := skipValue(data, pos, 0)
			if !ok {
				return syntaxError(end), end
			}
			return fail(ErrWrongType), end
		}
		s, end, ok := d.readString(data, pos)
		if !ok {
			return syntaxError(end), end
		}
		if err := d.setString(ev, k, s); err != nil {
			return fail(err), end
		}
		return failure{}, end

	case fieldCold, fieldCacheHit:
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
			end, ok = skipValue(data, pos, 0)
			if ok {
				return fail(ErrWrongType), end
			}
		}
		if !ok {
			return syntaxError(end), end
		}
		if k == fieldCold {
			ev.Cold = v
		} else {
			ev.CacheHit = v
		}
		return failure{}, end
	}

	// The remaining fields are numbers.
	if c != '-' && (c < '0' || c > '9') {
		end, ok := skipValue(data, pos, 0)
		if !ok {
			return syntaxError(end), end
		}
		return fail(ErrWrongType), end
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
	case fieldInputTokens, fieldOutputTokens:
		if !n.isInt {
			return fail(ErrWrongType), end
		}
		v, ok := n.integer()
		if !ok || v < 0 {
			return fail(ErrOutOfRange), end
		}
		if k == fieldInputTokens {
			ev.InputTokens = v
		} else {
			ev.OutputTokens = v
		}
	case fieldTTFT, fieldDuration, fieldRetryAfter:
		f, ok := n.float(num)
		if !ok || !(f >= 0 && f <= MaxDurationMs) { // NaN fails both
			return fail(ErrOutOfRange), end
		}
		switch k {
		case fieldTTFT:
			ev.TTFTMs, ev.HasTTFT = f, true
		case fieldDuration:
			ev.DurationMs, ev.HasDuration = f, true
		default:
			ev.RetryAfterMs = f
		}
	}
	return failure{}, end
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
	}
}

func skipSpace(data []byte, pos int) int {
	for pos < len(data) {
		switch data[pos] {
		case ' ', '\t', '\n', '\r':
			pos++
		default:
			return pos
		}
	}
	return pos
}

func literal(data []byte, pos int, word string) (int, bool) {
	if len(data)-pos < len(word) || string(data[pos:pos+len(word)]) != word {
		return pos, false
	}
	return pos + len(word), true
}

// readString reads the JSON string starting at the quote data[pos]. It
// returns its unescaped contents, which alias data when the string has no
// escapes and d.buf otherwise, and the offset just past the closing quote.
// On a syntax error it returns the offset of the offending byte.
func (d *Decoder) readString(data []byte, pos int) ([]byte, int, bool) {
	i := pos + 1
	for i < len(data) && !stringStop[data[i]] {
		i++
	}
	for ; i < len(data); i++ {
		switch c := data[i]; {
		case c == '"':
			return data[pos+1 : i], i + 1, true
		case c == '\\':
			return d.unescape(data, pos, i)
		case c < 0x20:
			return nil, i, false
		}
	}
	return nil, len(data), false
}

// stringStop marks the bytes that end the fast scan of a string: a quote,
// a backslash or a control character.
var stringStop = func() (t [256]bool) {
	for c := range 0x20 {
		t[c] = true
	}
	t['"'], t['\\'] = true, true
	return t
}()

// unescape is the slow path of readString, from the first backslash at
// data[i]. Like encoding/json, it replaces an invalid or unpaired surrogate
// escape by U+FFFD and passes other bytes through unchanged.
func (d *Decoder) unescape(data []byte, pos, i int) ([]byte, int, bool) {
	buf := append(d.buf[:0], data[pos+1:i]...)
	defer func() { d.buf = buf[:0] }()
	for i < len(data) {
		c := data[i]
		switch {
		case c == '"':
			return buf, i + 1, true
		case c < 0x20:
			return nil, i, false
		case c != '\\':
			buf = append(buf, c)
			i++
			continue
		}
		if i+1 >= len(data) {
			return nil, len(data), false
		}
		switch data[i+1] {
		case '"', '\\', '/':
			buf = append(buf, data[i+1])
		case 'b':
			buf = append(buf, '\b')
		case 'f':
			buf = append(buf, '\f')
		case 'n':
			buf = append(buf, '\n')
		case 'r':
			buf = append(buf, '\r')
		case 't':
			buf = append(buf, '\t')
		case 'u':
			r, ok := hex4(data, i+2)
			if !ok {
				return nil, i, false
			}
			i += 6
			if utf16.IsSurrogate(r) {
				if i+1 < len(data) && data[i] == '\\' && data[i+1] == 'u' {
					if r2, ok := hex4(data, i+2); ok {
						if dec := utf16.DecodeRune(r, r2); dec != utf8.RuneError {
							buf = utf8.AppendRune(buf, dec)
							i += 6
							continue
						}
					}
				}
				r = utf8.RuneError
			}
			buf = utf8.AppendRune(buf, r)
			continue
		default:
			return nil, i, false
		}
		i += 2
	}
	return nil, len(data), false
}

func hex4(data []byte, pos int) (rune, bool) {
	if len(data)-pos < 4 {
		return 0, false
	}
	var r rune
	for _, c := range data[pos : pos+4] {
		switch {
		case c >= '0' && c <= '9':
			c -= '0'
		case c >= 'a' && c <= 'f':
			c -= 'a' - 10
		case c >= 'A' && c <= 'F':
			c -= 'A' - 10
		default:
			return 0, false
		}
		r = r<<4 | rune(c)
	}
	return r, true
}

// skipString validates the JSON string starting at the quote data[pos]
// without unescaping it.
func skipString(data []byte, pos int) (int, bool) {
	for i := pos + 1; i < len(data); i++ {
		switch c := data[i]; {
		case c == '"':
			return i + 1, true
		case c < 0x20:
			return i, false
		case c == '\\':
			if i+1 >= len(data) {
				return len(data), false
			}
			switch data[i+1] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				i++
			case 'u':
				if _, ok := hex4(data, i+2); !ok {
					return i, false
				}
				i += 5
			default:
				return i, false
			}
		}
	}
	return len(data), false
}

// skipValue validates and skips the JSON value at data[pos:]. depth counts
// the enclosing arrays and objects.
func skipValue(data []byte, pos, depth int) (int, bool) {
	if pos >= len(data) {
		return pos, false
	}
	switch c := data[pos]; c {
	case '"':
		return skipString(data, pos)
	case 't':
		return literal(data, pos, "true")
	case 'f':
		return literal(data, pos, "false")
	case 'n':
		return literal(data, pos, "null")
	case '{', '[':
		if depth >= maxNesting {
			return pos, false
		}
		closer := byte('}')
		if c == '[' {
			closer = ']'
		}
		pos = skipSpace(data, pos+1)
		if pos < len(data) && data[pos] == closer {
			return pos + 1, true
		}
		for {
			var ok bool
			if c == '{' {
				if pos >= len(data) || data[pos] != '"' {
					return pos, false
				}
				if pos, ok = skipString(data, pos); !ok {
					return pos, false
				}
				pos = skipSpace(data, pos)
				if pos >= len(data) || data[pos] != ':' {
					return pos, false
				}
				pos = skipSpace(data, pos+1)
			}
			if pos, ok = skipValue(data, pos, depth+1); !ok {
				return pos, false
			}
			pos = skipSpace(data, pos)
			if pos >= len(data) {
				return pos, false
			}
			if data[pos] == closer {
				return pos + 1, true
			}
			if data[pos] != ',' {
				return pos, false
			}
			pos = skipSpace(data, pos+1)
		}
	default:
		var n number
		ok := scanNumber(data, pos, &n)
		return n.end, ok
	}
}

// number is a JSON number that scanNumber validated, with what the fast
// conversions need, gathered in the same pass.
type number struct {
	end    int    // offset just past the number
	neg    bool   // it starts with '-'
	isInt  bool   // neither fraction nor exponent
	exp    bool   // it has an exponent
	digits int    // digits before and after the point
	frac   int    // digits after the point
	mant   uint64 // the digits as an integer, when digits <= 19
}

// scanNumber validates the JSON number at data[pos:] and describes it in
// *n: -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?
// On failure n.end is the offset of the offending byte. (n is a parameter,
// not a result, because returning the struct costs a copy on the hot path.)
func scanNumber(data []byte, pos int, n *number) bool {
	*n = number{}
	i := pos
	if i < len(data) && data[i] == '-' {
		n.neg = true
		i++
	}
	switch {
	case i >= len(data):
		n.end = i
		return false
	case data[i] == '0':
		n.digits = 1
		i++
	case data[i] >= '1' && data[i] <= '9':
		start := i
		mant := uint64(0)
		for ; i < len(data) && data[i] >= '0' && data[i] <= '9'; i++ {
			mant = mant*10 + uint64(data[i]-'0')
		}
		n.mant, n.digits = mant, i-start
	default:
		n.end = i
		return false
	}
	n.isInt = true
	if i < len(data) && data[i] == '.' {
		n.isInt = false
		i++
		start := i
		mant := n.mant
		for ; i < len(data) && data[i] >= '0' && data[i] <= '9'; i++ {
			mant = mant*10 + uint64(data[i]-'0')
		}
		if i == start {
			n.end = i
			return false
		}
		n.mant, n.frac = mant, i-start
		n.digits += n.frac
	}
	if i < len(data) && (data[i] == 'e' || data[i] == 'E') {
		n.isInt, n.exp = false, true
		i++
		if i < len(data) && (data[i] == '+' || data[i] == '-') {
			i++
		}
		j := digits(data, i)
		if j == i {
			n.end = j
			return false
		}
		i = j
	}
	n.end = i
	return true
}

func digits(data []byte, i int) int {
	for i < len(data) && data[i] >= '0' && data[i] <= '9' {
		i++
	}
	return i
}

// integer returns the value of n, which scanNumber found to be an
// integer. It fails on int64 overflow.
func (n *number) integer() (int64, bool) {
	if n.digits > 19 { // mant wrapped; 19 digits fit a uint64
		return 0, false
	}
	if n.neg {
		if n.mant > 1<<63 {
			return 0, false
		}
		return -int64(n.mant), true
	}
	if n.mant > math.MaxInt64 {
		return 0, false
	}
	return int64(n.mant), true
}

// float64pow10 holds the powers of ten that float64 represents exactly.
var float64pow10 = [...]float64{
	1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10,
	1e11, 1e12, 1e13, 1e14, 1e15, 1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22,
}

// float returns the value of n (num holds its text). It fails when the
// value does not fit a float64. Plain decimals of at most 15 digits take
// Clinger's fast path (an exact integer divided by an exact power of ten is
// correctly rounded); everything else goes to strconv.
func (n *number) float(num []byte) (float64, bool) {
	if !n.exp && n.digits <= 15 {
		f := float64(n.mant) / float64pow10[n.frac]
		if n.neg {
			f = -f
		}
		return f, true
	}
	// string(num) does not escape strconv.ParseFloat, so for short numbers
	// the conversion uses a stack buffer and does not allocate.
	f, err := strconv.ParseFloat(string(num), 64)
	return f, err == nil
}

// parseFloat parses the JSON number num.
func parseFloat(num []byte) (float64, bool) {
	var n number
	if !scanNumber(num, 0, &n) || n.end != len(num) {
		return 0, false
	}
	return n.float(num)
}

// parseTime parses an RFC 3339 time, converts it to UTC and truncates it to
// the millisecond. The common form YYYY-MM-DDTHH:MM:SS[.fff…]Z is parsed by
// hand; any other goes through time.Parse.
func parseTime(s []byte) (time.Time, bool) {
	if t, ok := parseTimeUTC(s); ok {
		return t, true
	}
	t, err := time.Parse(time.RFC3339Nano, string(s))
	if err != nil {
		return time.Time{}, false
	}
	t = t.UTC()
	if y := t.Year(); y < 0 || y > 9999 {
		return time.Time{}, false
	}
	return t.Add(-time.Duration(t.Nanosecond() % int(time.Millisecond))), true
}

func parseTimeUTC(s []byte) (time.Time, bool) {
	if len(s) < 20 || s[len(s)-1] != 'Z' || s[4] != '-' || s[7] != '-' || s[10] != 'T' || s[13] != ':' || s[16] != ':' {
		return time.Time{}, false
	}
	year, ok1 := atoiN(s[0:4])
	month, ok2 := atoiN(s[5:7])
	day, ok3 := atoiN(s[8:10])
	hour, ok4 := atoiN(s[11:13])
	minute, ok5 := atoiN(s[14:16])
	sec, ok6 := atoiN(s[17:19])
	if !(ok1 && ok2 && ok3 && ok4 && ok5 && ok6) ||
		month < 1 || month > 12 || day < 1 || day > daysIn(month, year) ||
		hour > 23 || minute > 59 || sec > 59 {
		return time.Time{}, false
	}
	ms := 0
	if rest := s[19 : len(s)-1]; len(rest) > 0 {
		if rest[0] != '.' || len(rest) < 2 {
			return time.Time{}, false
		}
		for i, c := range rest[1:] {
			if c < '0' || c > '9' {
				return time.Time{}, false
			}
			if i < 3 {
				ms = ms*10 + int(c-'0')
			}
		}
		for i := len(rest) - 1; i < 3; i++ {
			ms *= 10
		}
	}
	unix := daysSinceEpoch(year, month, day)*86400 + int64(hour*3600+minute*60+sec)
	return time.Unix(unix, int64(ms)*int64(time.Millisecond)).UTC(), true
}

// daysSinceEpoch returns the days from 1970-01-01 to the given date of the
// proleptic Gregorian calendar (Howard Hinnant's days_from_civil; cheaper
// than time.Date, which normalizes and looks up the location).
func daysSinceEpoch(year, month, day int) int64 {
	if month <= 2 {
		year--
	}
	era := year / 400
	if year < 0 {
		era = (year - 399) / 400
	}
	yearOfEra := year - era*400
	shifted := month - 3 // March-based month, so that leap days come last
	if month <= 2 {
		shifted = month + 9
	}
	dayOfYear := (153*shifted+2)/5 + day - 1
	dayOfEra := yearOfEra*365 + yearOfEra/4 - yearOfEra/100 + dayOfYear
	return int64(era)*146097 + int64(dayOfEra) - 719468
}

func atoiN(s []byte) (int, bool) {
	n := 0
	for _, c := range s {
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + int(c-'0')
	}
	return n, true
}

func daysIn(month, year int) int {
	switch month {
	case 2:
		if year%4 == 0 && (year%100 != 0 || year%400 == 0) {
			return 29
		}
		return 28
	case 4, 6, 9, 11:
		return 30
	}
	return 31
}
