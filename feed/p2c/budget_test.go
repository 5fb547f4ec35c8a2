package p2c

import (
	"errors"
	"testing"
	"time"
)

// A retry storm: every attempt fails for 10 s of virtual time and every
// client retries up to three times. The budget holds retries to 20% of first
// attempts plus the floor (3/s over 10 s, plus the initial second).
func TestRetryBudgetStopsStorm(t *testing.T) {
	c := &clock{now: t0}
	p := newPicker(c, Settings{})
	p.Update(pool(1, backend("a", 100), backend("b", 100), backend("c", 100)))
	r := seeded(1)
	firsts, retries, refused := 0, 0, 0
	for step := 0; step < 1000; step++ { // 100 first attempts a second
		c.Advance(10 * time.Millisecond)
		p.Update(pool(uint64(step+2), backend("a", 100), backend("b", 100), backend("c", 100)))
		ch, err := pickDone(p, r, Request{})
		if err != nil {
			t.Fatal(err)
		}
		firsts++
		for range 3 { // the attempt failed; retry elsewhere
			ch, err = pickDone(p, r, Request{Exclude: ch.Backend})
			if errors.Is(err, ErrRetryBudget) {
				refused++
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			retries++
		}
	}
	limit := 0.2*float64(firsts) + DefaultRetryFloorPerSec*(10+1)
	if float64(retries) > limit {
		t.Errorf("%d retries for %d first attempts; budget limit %.0f", retries, firsts, limit)
	}
	if retries < firsts/10 {
		t.Errorf("only %d retries for %d first attempts: the budget should allow about 20%%", retries, firsts)
	}
	if refused == 0 {
		t.Error("no retry was refused during a storm")
	}
}

func TestBudgetFloorAndDecay(t *testing.T) {
	c := &clock{now: t0}
	b := NewBudget(0.2, 3, c.Now)
	// A quiet router can retry at the floor rate.
	n := 0
	for range 10 {
		c.Advance(time.Second)
		for b.Withdraw() {
			n++
		}
	}
	if n < 25 || n > 33 {
		t.Errorf("%d retries in 10 quiet seconds, want about 3/s", n)
	}
	// Deposits decay: 1000 first attempts long ago do not fund a storm now.
	for range 1000 {
		b.Deposit()
	}
	c.Advance(time.Hour)
	if got := b.Balance(); got > 31 {
		t.Errorf("balance an hour later = %.1f, want at most the floor's steady state 30", got)
	}
}

func TestUnbudgeted(t *testing.T) {
	c := &clock{now: t0}
	p := newPicker(c, Settings{RetryRatio: -1})
	p.Update(pool(1, backend("a", 100), backend("b", 100)))
	for i := range 1000 {
		if _, err := pickDone(p, seeded(uint64(i)), Request{Retry: true}); err != nil {
			t.Fatalf("retry %d: %v", i, err)
		}
	}
}
