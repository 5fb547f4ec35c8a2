package fleetwatch

// The low-level JSON scanning of the outcome-event decoder: whitespace,
// literals, strings with their escapes, skipping unknown values, numbers,
// and RFC 3339 times. decode.go holds the event-level logic.

import (
	"math"
	"strconv"
	"time"
	"unicode/utf16"
	"unicode/utf8"
)

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
