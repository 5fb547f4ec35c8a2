package p2c

import (
	"math"
	"sync"
	"time"
)

// budgetWindow is the retry budget's memory: deposits decay with this time
// constant, so the budget allows RetryRatio of the first attempts of roughly
// the last ten seconds (Finagle's RetryBudget uses a 10 s TTL likewise).
const budgetWindow = 10 * time.Second

// Budget is a retry budget shared by first attempts and retries, so that a
// failing pool cannot turn every request into several: each first attempt
// deposits ratio of a token, each retry withdraws one, and floorPerSec
// tokens a second accrue regardless of traffic so that a quiet router can
// still retry. The balance decays with a 10 s time constant, which also caps
// the floor's contribution at floorPerSec x 10 s. Safe for concurrent use.
type Budget struct {
	ratio       float64
	floorPerSec float64
	now         func() time.Time

	mu      sync.Mutex // guards balance, last, floorPerSec and rated
	balance float64
	last    time.Time
	rated   bool // setRate was called
}

// setRate changes the budget's accrual to ratePerSec from now on (the fleet
// share's rate, from the snapshot). The first call gives it one second's
// worth to start with.
func (b *Budget) setRate(ratePerSec float64, now time.Time) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.advance(now)
	if !b.rated {
		b.balance, b.rated = ratePerSec, true
	}
	b.floorPerSec = ratePerSec
}

// NewBudget returns a budget allowing retries of ratio of the first attempts
// plus floorPerSec per second. It starts with one second's floor. now nil
// means time.Now.
func NewBudget(ratio, floorPerSec float64, now func() time.Time) *Budget {
	if now == nil {
		now = time.Now
	}
	return &Budget{ratio: ratio, floorPerSec: floorPerSec, now: now, balance: floorPerSec, last: now()}
}

// Deposit records a first attempt.
func (b *Budget) Deposit() { b.depositAt(b.now()) }

// Withdraw records a retry if the budget allows one and reports whether it
// did. A false return means: do not retry.
func (b *Budget) Withdraw() bool { return b.withdrawAt(b.now()) }

// Balance returns the retries currently available.
func (b *Budget) Balance() float64 {
	now := b.now()
	b.mu.Lock()
	defer b.mu.Unlock()
	b.advance(now)
	return b.balance
}

func (b *Budget) depositAt(now time.Time) {
	b.mu.Lock()
	b.advance(now)
	b.balance += b.ratio
	b.mu.Unlock()
}

func (b *Budget) withdrawAt(now time.Time) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.advance(now)
	if b.balance < 1 {
		return false
	}
	b.balance--
	return true
}

// advance decays the balance toward the floor's steady state,
// floorPerSec x window, over the time since the last call.
func (b *Budget) advance(now time.Time) {
	dt := now.Sub(b.last)
	if dt <= 0 {
		return
	}
	b.last = now
	tau := budgetWindow.Seconds()
	decay := math.Exp(-dt.Seconds() / tau)
	b.balance = b.balance*decay + b.floorPerSec*tau*(1-decay)
}
