package analyzer

import (
	"fmt"
	"strconv"
)

// Status classes of client errors: the 4xx codes a backend answers when it
// is the one at fault (a replica serving another model answers 404, a
// revoked key 401 or 403, a wrong path 404 or 405, a changed limit 413, a
// changed schema 400 or 422), and "other" for any other status of a
// client_error event (another 4xx, or none). The client-error rule names
// the dominant class in its reason.
var statusClasses = [...]int{400, 401, 403, 404, 405, 413, 422}

// numStatusClasses is the listed codes and "other".
const numStatusClasses = len(statusClasses) + 1

// statusCounts counts client errors by status class (the last is "other").
type statusCounts [numStatusClasses]uint32

// classOf is the status class of a client error's status.
func classOf(status int) int {
	for k, c := range statusClasses {
		if c == status {
			return k
		}
	}
	return len(statusClasses)
}

// className is the reason's name of class k: the code, or "other 4xx".
func className(k int) string {
	if k < len(statusClasses) {
		return strconv.Itoa(statusClasses[k])
	}
	return "other 4xx"
}

// dominant is the class with the most client errors (the lowest code on a
// tie), its count, and whether it is the only class with any.
func (c *statusCounts) dominant() (k int, n uint32, only bool) {
	classes := 0
	for i, v := range c {
		if v > 0 {
			classes++
		}
		if v > n {
			k, n = i, v
		}
	}
	return k, n, classes == 1
}

// clientErrorLabel names the client errors of a window for a reason: "404
// rate 1.00" when every one is a 404, "client-error rate 0.80 (mostly 404:
// 0.60)" when several classes share them. rate is the client-error rate
// quoted; the dominant class's share is its part of the window's client
// errors times rate.
func clientErrorLabel(c *statusCounts, rate float64) string {
	k, n, only := c.dominant()
	var total uint64
	for _, v := range c {
		total += uint64(v)
	}
	switch {
	case n == 0:
		return fmt.Sprintf("client-error rate %.2f", rate)
	case only:
		return fmt.Sprintf("%s rate %.2f", className(k), rate)
	}
	return fmt.Sprintf("client-error rate %.2f (mostly %s: %.2f)", rate, className(k), rate*float64(n)/float64(total))
}
