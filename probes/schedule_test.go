package probes

import (
	"testing"
	"time"

	"github.com/robfig/cron/v3"
)

func TestJitteredSchedules(t *testing.T) {
	t0 := time.Date(2026, 3, 2, 8, 59, 0, 0, time.UTC)
	every, err := cron.ParseStandard("@every 5m")
	if err != nil {
		t.Fatal(err)
	}
	j := &jittered{inner: every, offset: 40 * time.Second}
	first := j.Next(t0)
	second := j.Next(first)
	if want := t0.Add(5*time.Minute + 40*time.Second); !first.Equal(want) {
		t.Errorf("@every: first activation %v, want %v", first, want)
	}
	if want := first.Add(5 * time.Minute); !second.Equal(want) {
		t.Errorf("@every: second activation %v, want %v (the offset kept)", second, want)
	}
	daily, err := cron.ParseStandard("0 9 * * *")
	if err != nil {
		t.Fatal(err)
	}
	d := &jittered{inner: daily, offset: 90 * time.Second}
	a := d.Next(t0)
	b := d.Next(a)
	if want := time.Date(2026, 3, 2, 9, 1, 30, 0, time.UTC); !a.Equal(want) {
		t.Errorf("spec: first activation %v, want %v", a, want)
	}
	if want := a.Add(24 * time.Hour); !b.Equal(want) {
		t.Errorf("spec: second activation %v, want %v", b, want)
	}
}
