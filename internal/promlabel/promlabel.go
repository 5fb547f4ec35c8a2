// Package promlabel quotes Prometheus label values. A leaf: it imports
// the standard library only, so every package that names metric series
// may use it.
package promlabel

import "strings"

// Quote quotes v as a Prometheus label value in the text exposition
// format: a backslash, a double quote and a line feed are escaped, and
// nothing else is (strconv.Quote writes \t, \x.. and \u.... escapes that
// Prometheus does not read back). Ids that need no escaping cost one
// allocation.
func Quote(v string) string {
	if !strings.ContainsAny(v, "\\\"\n") {
		return `"` + v + `"`
	}
	var b strings.Builder
	b.Grow(len(v) + 8)
	b.WriteByte('"')
	for i := 0; i < len(v); i++ {
		switch c := v[i]; c {
		case '\\':
			b.WriteString(`\\`)
		case '"':
			b.WriteString(`\"`)
		case '\n':
			b.WriteString(`\n`)
		default:
			b.WriteByte(c)
		}
	}
	b.WriteByte('"')
	return b.String()
}
