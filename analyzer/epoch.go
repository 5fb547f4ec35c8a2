package analyzer

import (
	"math/rand/v2"
	"time"
)

// crockford is the ULID alphabet (Crockford's base32).
const crockford = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"

// newEpoch returns a ULID-layout id: 48 bits of Unix milliseconds of now
// then 80 bits from rng, 26 characters of Crockford base32. Ids made later
// sort later, so an operator can tell which analyzer instance is newer.
func newEpoch(now time.Time, rng *rand.Rand) string {
	var raw [16]byte
	ms := uint64(max(now.UnixMilli(), 0))
	for i := range 6 {
		raw[i] = byte(ms >> (40 - 8*i))
	}
	hi, lo := rng.Uint64(), rng.Uint64()
	for i := range 2 {
		raw[6+i] = byte(hi >> (8 - 8*i))
	}
	for i := range 8 {
		raw[8+i] = byte(lo >> (56 - 8*i))
	}
	// 128 bits as 26 base32 digits: the first digit carries the top 3 bits.
	var out [26]byte
	var acc uint32
	bits := 2 // pad the front with two zero bits: 130 = 26 x 5
	idx := 0
	for _, by := range raw {
		acc = acc<<8 | uint32(by)
		bits += 8
		for bits >= 5 {
			bits -= 5
			out[idx] = crockford[(acc>>bits)&31]
			idx++
		}
	}
	return string(out[:idx])
}
