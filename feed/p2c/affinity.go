package p2c

import "slices"

// Affinity maps a prefix hash to a backend in two steps, so that a pick
// costs O(1) whatever the pool's size:
//
//  1. the key picks one of a fixed number of slots (a power of two, at
//     least slotsPerBackend per backend of the snapshot): slot =
//     mix64(key) & mask;
//  2. the slot's owner is the rendezvous (highest random weight) winner
//     over the sticky candidates: argmax over b of mix64(slotKey ^ id(b)).
//
// Step 2 is cached per slot in an affinityTable built once per snapshot.
// Because each slot is an independent rendezvous, removing a backend moves
// only the slots it owned and adding one takes slots only from others,
// exactly as rendezvous hashing over the keys themselves would; the table is
// updated incrementally in O(slots x changed backends) rather than rebuilt.
// The slot count follows the snapshot's backends, every one and not only
// the sticky candidates, so that it is the same in every router holding
// the snapshot whatever each saw before: a key keeps its slot while
// backends open and close, and a picker whose first snapshot comes during
// an incident sends a prefix where the pickers before it do
// (TestAffinityAgreesAcrossHistories). Only a pool whose size crosses a
// power of two moves every key, in every router at once. The stale path
// computes step 2 directly over its own candidate set, with the same
// result when the sets agree.

// slotsPerBackend is the least number of slots per backend: the
// share of keys a backend owns varies by about 1/sqrt(32), 18%, around 1/n.
const slotsPerBackend = 32

// minSlots is the least table size.
const minSlots = 256

// affinityTable is the slot-to-backend map of one snapshot's sticky
// candidates. It is immutable once built, and shared with the next
// snapshot's state when the candidates did not change.
type affinityTable struct {
	mask      uint64
	ownerHash []uint64 // id hash of each slot's owner
	best      []uint64 // the owner's rendezvous value for the slot
	owner     []int32  // the owner's entry index in the state it was built for
	members   []uint64 // the candidates' id hashes, in entry order
	indices   []int    // the candidates' entry indices
}

// slotOf is the slot of a prefix hash.
func (t *affinityTable) slotOf(key uint64) uint64 { return mix64(key^0x243f6a8885a308d3) & t.mask }

// slotKey is the rendezvous key of a slot.
func slotKey(slot uint64) uint64 { return mix64(slot*0x9e3779b97f4a7c15 + 1) }

// lookup returns the entry owning key's slot, or -1 for an empty table.
func (t *affinityTable) lookup(key uint64) int {
	if t == nil || len(t.owner) == 0 {
		return -1
	}
	return int(t.owner[t.slotOf(key)])
}

// slotMask is the slot mask of a snapshot of n backends.
func slotMask(n int) uint64 {
	size := uint64(minSlots)
	for size < uint64(slotsPerBackend*n) {
		size <<= 1
	}
	return size - 1
}

// buildAffinity returns the table of mask's slots for the sticky
// candidates (entry indices and their id hashes), reusing prev where it
// can.
func buildAffinity(prev *affinityTable, mask uint64, indices []int, hashes []uint64) *affinityTable {
	if len(indices) == 0 {
		return nil
	}
	if prev != nil && prev.mask == mask && slices.Equal(prev.members, hashes) && slices.Equal(prev.indices, indices) {
		return prev // nothing changed
	}
	size := mask + 1
	t := &affinityTable{
		mask:      size - 1,
		ownerHash: make([]uint64, size),
		best:      make([]uint64, size),
		owner:     make([]int32, size),
		members:   slices.Clone(hashes),
		indices:   slices.Clone(indices),
	}
	full := func(slot uint64) {
		k := slotKey(slot)
		var bestH, bestV uint64
		for j, h := range hashes {
			if v := mix64(k ^ h); j == 0 || v > bestV {
				bestH, bestV = h, v
			}
		}
		t.ownerHash[slot], t.best[slot] = bestH, bestV
	}
	if prev == nil || prev.mask != t.mask {
		for slot := range size {
			full(slot)
		}
	} else {
		removed := make(map[uint64]bool)
		for _, h := range prev.members {
			removed[h] = true
		}
		var added []uint64
		for _, h := range hashes {
			if removed[h] {
				delete(removed, h) // still a member
			} else {
				added = append(added, h)
			}
		}
		for slot := range size {
			if removed[prev.ownerHash[slot]] {
				full(slot)
				continue
			}
			t.ownerHash[slot], t.best[slot] = prev.ownerHash[slot], prev.best[slot]
			if len(added) > 0 {
				k := slotKey(slot)
				for _, h := range added {
					if v := mix64(k ^ h); v > t.best[slot] {
						t.ownerHash[slot], t.best[slot] = h, v
					}
				}
			}
		}
	}
	index := make(map[uint64]int32, len(hashes))
	for j, h := range hashes {
		index[h] = int32(indices[j])
	}
	for slot := range size {
		t.owner[slot] = index[t.ownerHash[slot]]
	}
	return t
}

// rendezvousSlot is step 2 computed directly: the entry among cands[:m]
// that wins key's slot, skipping ex; -1 when there is none. With the same
// candidates it returns what the table holds.
func (st *state) rendezvousSlot(key uint64, cands []int, m, ex int) int {
	slot := mix64(key^0x243f6a8885a308d3) & st.slotMask
	k := slotKey(slot)
	best, bestV := -1, uint64(0)
	for _, i := range cands[:m] {
		if i == ex {
			continue
		}
		if v := mix64(k ^ st.entries[i].idHash); best < 0 || v > bestV {
			best, bestV = i, v
		}
	}
	return best
}
