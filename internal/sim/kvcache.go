package sim

// blockCache is a backend's KV cache of prompt blocks, as a vLLM-style
// prefix cache holds them: a fixed number of blocks (BackendSpec.KVBlocks)
// of BlockTokens tokens each, evicted least recently used first. A block is
// named by its prefix key (the hash of every block up to and including it,
// see chainBlocks), so a request's hit is the run of its leading blocks
// present: a block whose predecessor was evicted is not reused, as in vLLM.
//
// A request's blocks are touched tail first, so that its first block is
// the most recent and its last the least: of one prompt, the tail goes
// before the head, and since every use of a block uses its predecessors
// after it, a block is always more recent than the blocks that extend it.
// Eviction thus takes leaves first and never leaves a cached tail behind
// an evicted head, as both servers' caches do. vLLM frees a finished
// request's blocks in reverse order onto its LRU free queue ("so that the
// tail blocks are evicted first": KVCacheManager.free in
// vllm/v1/core/kv_cache_manager.py; FreeKVCacheBlockQueue in
// vllm/v1/core/kv_cache_utils.py orders blocks of equal last use with
// more hash tokens first), and SGLang's RadixCache.evict
// (python/sglang/srt/mem_cache/radix_cache.py) evicts leaves by last
// access, a parent only once it has become a leaf. Until 2026-12-06 the
// blocks were touched head first: a prompt's first block was evicted
// before its tail, whose blocks then held space no request could reach.
//
// Blocks in use by a running request are not pinned (a simplification: at
// these capacities a request's own blocks are the most recent).
type blockCache struct {
	capacity   int
	index      map[uint64]int32 // key -> node
	key        []uint64
	prev, next []int32 // doubly linked, most recent at head
	head, tail int32
}

func newBlockCache(capacity int) *blockCache {
	return &blockCache{capacity: capacity, index: make(map[uint64]int32, capacity), head: -1, tail: -1}
}

// leading is how many of blocks' leading blocks are cached, without
// touching anything (what a perfect-knowledge router may look at).
func (c *blockCache) leading(blocks []uint64) int {
	for i, k := range blocks {
		if _, ok := c.index[k]; !ok {
			return i
		}
	}
	return len(blocks)
}

// use serves a request's blocks: it returns the leading blocks that were
// cached, then makes every block of the request the most recent, inserting
// the missing ones and evicting the least recently used at capacity. The
// blocks are touched last to first (see blockCache): the request's head is
// then the most recent and its tail the first to go.
func (c *blockCache) use(blocks []uint64) int {
	hit := c.leading(blocks)
	for i := len(blocks) - 1; i >= 0; i-- {
		c.touch(blocks[i])
	}
	return hit
}

// size is the number of blocks held.
func (c *blockCache) size() int { return len(c.index) }

func (c *blockCache) unlink(n int32) {
	p, nx := c.prev[n], c.next[n]
	if p >= 0 {
		c.next[p] = nx
	} else {
		c.head = nx
	}
	if nx >= 0 {
		c.prev[nx] = p
	} else {
		c.tail = p
	}
}

func (c *blockCache) pushFront(n int32) {
	c.prev[n], c.next[n] = -1, c.head
	if c.head >= 0 {
		c.prev[c.head] = n
	}
	c.head = n
	if c.tail < 0 {
		c.tail = n
	}
}

func (c *blockCache) touch(k uint64) {
	if c.capacity <= 0 {
		return
	}
	if n, ok := c.index[k]; ok {
		if n != c.head {
			c.unlink(n)
			c.pushFront(n)
		}
		return
	}
	var n int32
	if len(c.key) < c.capacity {
		n = int32(len(c.key))
		c.key = append(c.key, k)
		c.prev = append(c.prev, -1)
		c.next = append(c.next, -1)
	} else {
		n = c.tail // evict the least recently used
		c.unlink(n)
		delete(c.index, c.key[n])
		c.key[n] = k
	}
	c.index[k] = n
	c.pushFront(n)
}

// chainBlocks turns a prompt's block ids (Mooncake's hash_ids: equal ids in
// equal leading positions are the same tokens) into prefix keys: key i
// hashes blocks 0..i, so that equal keys always mean an equal prefix, even
// for a trace whose ids are per-block contents rather than per prefix.
func chainBlocks(ids []uint64) []uint64 {
	out := make([]uint64, len(ids))
	h := uint64(0x9e3779b97f4a7c15)
	for i, id := range ids {
		h = mix64(h ^ mix64(id+0x51ed))
		out[i] = h
	}
	return out
}
