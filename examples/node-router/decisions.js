// The decision logic of a thin router, as docs/PROTOCOL.md describes it:
// which snapshot to keep (epoch, seq, at and fence), when a snapshot is
// stale, and how to pick a backend by weight. No I/O here, so that
// test/decisions.test.js checks it alone.
"use strict";

// newerThan reports whether snapshot s should replace prev (the last one
// applied for the pool). Fenced snapshots with different fences: the higher
// fence wins whatever at and epoch say. Same epoch: a larger seq. Another
// epoch (a restarted or failed-over analyzer): an at that is not older.
function newerThan(s, prev) {
  if (!prev) return true;
  const f = s.fence || 0;
  const pf = prev.fence || 0;
  if (f !== 0 && pf !== 0 && f !== pf) return f > pf;
  if (s.epoch === prev.epoch) return s.seq > prev.seq;
  return Date.parse(s.at) >= Date.parse(prev.at);
}

// Pool keeps the snapshot a router applies for one pool, and the highest
// fence it has seen: a snapshot with a lower fence is dropped even when
// the kept one has none (a deposed publisher).
class Pool {
  constructor() {
    this.snap = null;
    this.maxFence = 0;
    this.applied = 0;
    this.ignored = 0; // not newer
    this.fenced = 0; // below the highest fence seen
  }

  // offer applies s when it is newer and not fenced off; it returns why not
  // otherwise ("fenced", "old") or "applied".
  offer(s) {
    const f = s.fence || 0;
    if (f !== 0 && f < this.maxFence) {
      this.fenced++;
      return "fenced";
    }
    if (!newerThan(s, this.snap)) {
      this.ignored++;
      return "old";
    }
    if (f > this.maxFence) this.maxFence = f;
    this.snap = s;
    this.applied++;
    return "applied";
  }
}

// isStale: a snapshot older than at + ttl_ms.
function isStale(s, now) {
  return now > Date.parse(s.at) + s.ttl_ms;
}

// weights returns [{backend, weight}] that a pick samples from, for the
// backends the router can reach (known: a Set of backend ids).
//   - No snapshot: every known backend with weight 1.
//   - Fresh snapshot: the snapshot's backends that are known; open ones get
//     0, half_open keep their (trickle) weight. A backend missing from the
//     snapshot gets nothing (a truncated snapshot lists every open one).
//     mode failover: tiers by priority, each taking min(W, 1) of what the
//     earlier tiers left (docs/PROTOCOL.md "Decision snapshots").
//     Every backend open: all_open "shed" returns [] (fail fast), "spread"
//     ignores the breakers.
//   - Stale snapshot (fail static): equal weights, except breakers whose
//     open_until is still ahead, which stay open.
function weights(s, known, now) {
  if (!s) return [...known].map((b) => ({ backend: b, weight: 1 }));
  const bs = s.backends.filter((b) => known.has(b.backend));
  if (isStale(s, now)) {
    const out = bs
      .filter((b) => !(b.state === "open" && b.open_until && Date.parse(b.open_until) > now))
      .map((b) => ({ backend: b.backend, weight: 1 }));
    return out.length > 0 ? out : bs.map((b) => ({ backend: b.backend, weight: 1 }));
  }
  const usable = bs.filter((b) => b.state !== "open");
  if (usable.length === 0) {
    if (s.all_open === "spread") return bs.map((b) => ({ backend: b.backend, weight: 1 }));
    return [];
  }
  if (s.mode !== "failover") {
    return usable.map((b) => ({ backend: b.backend, weight: b.weight }));
  }
  const tiers = new Map();
  for (const b of usable) {
    const p = b.priority || 0;
    if (!tiers.has(p)) tiers.set(p, []);
    tiers.get(p).push(b);
  }
  const order = [...tiers.keys()].sort((a, b) => a - b);
  const out = [];
  let left = 1;
  for (const p of order) {
    const tier = tiers.get(p);
    const w = tier.reduce((sum, b) => sum + b.weight, 0);
    if (w <= 0 || left <= 0) continue;
    const share = left * Math.min(w, 1);
    for (const b of tier) out.push({ backend: b.backend, weight: (share * b.weight) / w });
    left -= share;
  }
  if (out.every((b) => b.weight <= 0)) {
    // Every tier at weight 0: the lowest tier with equal weights.
    return tiers.get(order[0]).map((b) => ({ backend: b.backend, weight: 1 }));
  }
  return out;
}

// pick samples a backend id with probability proportional to its weight,
// or returns null when nothing may be picked. rand is Math.random by
// default.
function pick(ws, rand = Math.random) {
  const total = ws.reduce((sum, b) => sum + Math.max(b.weight, 0), 0);
  if (total <= 0) return null;
  let r = rand() * total;
  for (const b of ws) {
    r -= Math.max(b.weight, 0);
    if (r < 0) return b.backend;
  }
  return ws.filter((b) => b.weight > 0).at(-1).backend;
}

// outcomeOf derives the event's outcome from an HTTP status as
// docs/PROTOCOL.md does (0: no answer came).
function outcomeOf(status) {
  if (status >= 200 && status < 300) return "ok";
  if (status === 429) return "throttled";
  if (status === 408 || status === 504 || status === 0) return "timeout";
  if (status === 499) return "canceled";
  if (status >= 400 && status < 500) return "client_error";
  return "error";
}

module.exports = { newerThan, Pool, isStale, weights, pick, outcomeOf };
