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

// shadowView returns the decisions a router follows for a snapshot in
// shadow mode (docs/PROTOCOL.md "Shadow mode (extension)"), s itself when
// the mode is off: "breakers" weights every closed backend 1 (open ones get
// nothing, half-open ones keep their trickle); "observe" treats every
// backend as closed at weight 1. A backend with an operator override keeps
// its published state and weight, except that force_closed is closed at 1.
function shadowView(s) {
  if (!s || (s.shadow !== "breakers" && s.shadow !== "observe")) return s;
  const backends = s.backends.map((b) => {
    if (b.override && b.override.kind === "force_closed") return { ...b, state: "closed", weight: 1, open_until: null };
    if (b.override) return b;
    if (s.shadow === "observe") return { ...b, state: "closed", weight: 1, open_until: null };
    if (b.state === "closed") return { ...b, weight: 1 };
    return b;
  });
  return { ...s, backends };
}

// shadowPick picks a backend for snapshot s: on shadowView(s), and, when s
// is in shadow mode, also on the full decisions from the same draw,
// counting in stats ({picks, differed, excluded}) the picks that differ
// and those (on a fresh snapshot) of a backend the full decisions give
// nothing. Without shadow mode it is pick(weights(s, ...)).
function shadowPick(s, known, now, stats, rand = Math.random) {
  const view = shadowView(s);
  const r = rand();
  const chosen = pick(weights(view, known, now), () => r);
  if (view === s || chosen === null) return chosen;
  const full = weights(s, known, now);
  stats.picks++;
  if (pick(full, () => r) !== chosen) stats.differed++;
  if (!isStale(s, now) && !full.some((w) => w.backend === chosen && w.weight > 0)) stats.excluded++;
  return chosen;
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

// maxRetryHintMs caps a stated wait at one hour, as fleetwatch does.
const maxRetryHintMs = 3_600_000;

// retryAfterMs is the wait, in ms, that a backend's answer states, for an
// event's retry_after_ms (docs/PROTOCOL.md "Where retry_after_ms comes
// from"; fleetwatch.ParseRetryHint in Go): the first of these that states
// one wins, capped at an hour; 0 when none does. headers are Node's
// (lower-case names); now is when the answer came (ms since the epoch).
//
//  1. retry-after-ms: milliseconds (Azure OpenAI).
//  2. Retry-After: seconds, or an HTTP date (the wait is date - now).
//  3. On a 429: x-ratelimit-reset-requests / -tokens (OpenAI), durations
//     such as "6m0s", "1m30.5s", "20ms", or plain seconds.
//  4. On a 429: anthropic-ratelimit-{requests,tokens,input-tokens,
//     output-tokens}-reset, RFC 3339 times (the wait is time - now).
//
// Of one provider's reset headers, the largest wait among the limits whose
// remaining count is 0 is taken (the largest of all when none says which
// ran out): they come on every answer, so only a 429 reads them. A
// malformed or negative value is skipped, a past time states no wait. A
// "retryDelay" in a JSON error body (Google) is not read: this router
// streams bodies through without keeping them.
//
// The hint is what tells a quota (a 429 with a wait) from a full queue (a
// bare 429): fleetwatch opens a backend on five hinted 429s in a row or a
// hinted 429 rate, and only lowers the weight of one whose 429s are bare,
// unless nearly every request of its last seconds is refused while its
// peers serve (analyzer.throttle_refuse_rate).
function retryAfterMs(status, headers, now) {
  const header = (name) => {
    const v = headers[name];
    return (Array.isArray(v) ? v[0] : v ?? "").trim();
  };
  const capped = (ms) => Math.min(ms, maxRetryHintMs);
  const number = (v) => (/^(\d+\.?\d*|\.\d+)$/.test(v) ? Number(v) : NaN);

  const ms = number(header("retry-after-ms"));
  if (ms > 0) return capped(ms);
  const ra = header("retry-after");
  if (ra !== "") {
    const secs = number(ra);
    const wait = Number.isNaN(secs) ? Date.parse(ra) - now : secs * 1000;
    if (wait > 0) return capped(wait);
  }
  if (status !== 429) return 0;
  const largest = (limits, parse) => {
    let exhausted = 0;
    let any = 0;
    for (const [reset, remaining] of limits) {
      const v = header(reset);
      if (v === "") continue;
      const wait = parse(v);
      if (!(wait > 0)) continue;
      any = Math.max(any, wait);
      if (header(remaining) === "0") exhausted = Math.max(exhausted, wait);
    }
    return exhausted > 0 ? exhausted : any;
  };
  const openAI = largest(
    [
      ["x-ratelimit-reset-requests", "x-ratelimit-remaining-requests"],
      ["x-ratelimit-reset-tokens", "x-ratelimit-remaining-tokens"],
    ],
    goDuration,
  );
  if (openAI > 0) return capped(openAI);
  const anthropic = largest(
    ["requests", "tokens", "input-tokens", "output-tokens"].map((k) => [
      `anthropic-ratelimit-${k}-reset`,
      `anthropic-ratelimit-${k}-remaining`,
    ]),
    (v) => (/^\d{4}-\d{2}-\d{2}T/.test(v) ? Date.parse(v) - now : NaN),
  );
  return anthropic > 0 ? capped(anthropic) : 0;
}

// goDuration parses a Go duration ("6m0s", "1m30.5s", "20ms") or plain
// seconds ("0.5") into ms; NaN when it is neither.
function goDuration(v) {
  if (/^(\d+\.?\d*|\.\d+)$/.test(v)) return Number(v) * 1000;
  if (!/^((\d+\.?\d*|\.\d+)(h|ms|m|s|us|µs|ns))+$/.test(v)) return NaN;
  const unit = { h: 3_600_000, m: 60_000, s: 1000, ms: 1, us: 1e-3, "µs": 1e-3, ns: 1e-6 };
  let total = 0;
  for (const [, n, u] of v.matchAll(/(\d+\.?\d*|\.\d+)(h|ms|m|s|us|µs|ns)/g)) total += Number(n) * unit[u];
  return total;
}

module.exports = { newerThan, Pool, isStale, weights, pick, shadowView, shadowPick, outcomeOf, retryAfterMs };
