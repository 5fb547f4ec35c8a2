package fleetwatch

import (
	"errors"
	"time"
)

// TimeLayout is the protocol's time format: RFC 3339, milliseconds, UTC.
const TimeLayout = "2006-01-02T15:04:05.000Z07:00"

// Time is a time.Time that encodes as RFC 3339 with milliseconds in UTC, as
// every time on the wire does. Decoding accepts any RFC 3339 time.
type Time struct{ time.Time }

// At wraps t, truncated to the millisecond and converted to UTC.
func At(t time.Time) Time { return Time{t.UTC().Truncate(time.Millisecond)} }

// FormatTime formats t the protocol's way.
func FormatTime(t time.Time) string { return t.UTC().Format(TimeLayout) }

// AppendTime appends t formatted the protocol's way.
func AppendTime(b []byte, t time.Time) []byte { return t.UTC().AppendFormat(b, TimeLayout) }

// MarshalJSON implements json.Marshaler.
func (t Time) MarshalJSON() ([]byte, error) {
	b := make([]byte, 0, len(TimeLayout)+2)
	b = append(b, '"')
	b = AppendTime(b, t.Time)
	return append(b, '"'), nil
}

// UnmarshalJSON implements json.Unmarshaler.
func (t *Time) UnmarshalJSON(b []byte) error {
	if len(b) < 2 || b[0] != '"' || b[len(b)-1] != '"' {
		return errors.New("fleetwatch: time must be an RFC 3339 string")
	}
	v, err := time.Parse(time.RFC3339Nano, string(b[1:len(b)-1]))
	if err != nil {
		return err
	}
	t.Time = v.UTC()
	return nil
}
