package fleetwatch

import (
	"fmt"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func TestSubjectsHA(t *testing.T) {
	type names struct{ Partition, PartitionWildcard, Presence, BucketLeases string }
	tests := []struct {
		s    Subjects
		want names
	}{
		{Subjects{}, names{"fw.partition.7", "fw.partition.>", "fw.presence", "fw_leases"}},
		{Subjects{Prefix: "acme.fw"}, names{"acme.fw.partition.7", "acme.fw.partition.>", "acme.fw.presence", "acme_fw_leases"}},
	}
	for _, tt := range tests {
		got := names{tt.s.Partition(7), tt.s.PartitionWildcard(), tt.s.Presence(), tt.s.BucketLeases()}
		if diff := cmp.Diff(tt.want, got); diff != "" {
			t.Errorf("prefix %q (-want +got):\n%s", tt.s.Prefix, diff)
		}
	}
}

func TestPartitionOf(t *testing.T) {
	// FNV-1a 32 of "" is 0x811c9dc5, of "a" 0xe40c292c: fixed values, so
	// that every instance and every version agree.
	tests := []struct {
		pool string
		n    int
		want int
	}{
		{"", 16, 0x811c9dc5 % 16},
		{"a", 16, 0xe40c292c % 16},
		{"a", 1000, 0xe40c292c % 1000},
		{"a", 1, 0},
		{"a", 0, 0},
	}
	for _, tt := range tests {
		if got := PartitionOf(tt.pool, tt.n); got != tt.want {
			t.Errorf("PartitionOf(%q, %d) = %d, want %d", tt.pool, tt.n, got, tt.want)
		}
	}
	// The pools spread over the partitions: 1,600 pools leave none of 16
	// empty nor any with more than twice its share.
	counts := make([]int, 16)
	for i := range 1600 {
		counts[PartitionOf(fmt.Sprintf("pool-%d", i), 16)]++
	}
	for p, c := range counts {
		if c == 0 || c > 200 {
			t.Errorf("partition %d has %d of 1600 pools: %v", p, c, counts)
		}
	}
}

func TestSnapshotNewerThanFence(t *testing.T) {
	at := time.Date(2026, 12, 3, 7, 0, 0, 0, time.UTC)
	snap := func(epoch string, seq, fence uint64, at time.Time) *Snapshot {
		return &Snapshot{Epoch: epoch, Seq: seq, At: At(at), Fence: fence}
	}
	tests := []struct {
		name    string
		s, prev *Snapshot
		want    bool
	}{
		{"higher fence, earlier at", snap("e2", 1, 9, at.Add(-time.Second)), snap("e1", 5, 4, at), true},
		{"lower fence, later at", snap("e1", 6, 4, at.Add(time.Second)), snap("e2", 1, 9, at), false},
		{"lower fence, same epoch, next seq", snap("e1", 6, 4, at), snap("e1", 5, 9, at), false},
		{"same fence, same epoch, next seq", snap("e1", 6, 9, at), snap("e1", 5, 9, at), true},
		{"same fence, same epoch, same seq", snap("e1", 5, 9, at), snap("e1", 5, 9, at), false},
		{"unfenced after fenced: by epoch and at", snap("e3", 1, 0, at.Add(time.Second)), snap("e2", 1, 9, at), true},
		{"fenced after unfenced: by epoch and at", snap("e2", 1, 3, at.Add(-time.Second)), snap("e3", 1, 0, at), false},
	}
	for _, tt := range tests {
		if got := tt.s.NewerThan(tt.prev); got != tt.want {
			t.Errorf("%s: NewerThan = %v, want %v", tt.name, got, tt.want)
		}
	}
}
