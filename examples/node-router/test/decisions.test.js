"use strict";
const test = require("node:test");
const assert = require("node:assert/strict");
const { newerThan, Pool, isStale, weights, pick, shadowView, shadowPick, outcomeOf, retryAfterMs } = require("../decisions");

const snap = (o) => ({
  v: 1, pool: "p", epoch: "E1", seq: 1, at: "2026-12-02T07:50:00.000Z", ttl_ms: 5000,
  mode: "balance", all_open: "shed", backends: [], ...o,
});
const now = Date.parse("2026-12-02T07:50:01.000Z");

test("ordering: seq within an epoch, at across epochs, fence first", () => {
  const cases = [
    ["larger seq", snap({ seq: 2 }), snap({ seq: 1 }), true],
    ["same seq", snap({ seq: 1 }), snap({ seq: 1 }), false],
    ["smaller seq, later at", snap({ seq: 1, at: "2026-12-02T07:51:00.000Z" }), snap({ seq: 2 }), false],
    ["other epoch, same at", snap({ epoch: "E2" }), snap({ seq: 9 }), true],
    ["other epoch, older at", snap({ epoch: "E2", at: "2026-12-02T07:49:00.000Z" }), snap(), false],
    ["higher fence, older at", snap({ fence: 3, epoch: "E2", at: "2026-12-02T07:49:00.000Z" }), snap({ fence: 2 }), true],
    ["lower fence, larger seq", snap({ fence: 1, seq: 5 }), snap({ fence: 2 }), false],
    ["nothing before", snap(), null, true],
  ];
  for (const [name, s, prev, want] of cases) assert.equal(newerThan(s, prev), want, name);
});

test("Pool drops a snapshot below the highest fence seen", () => {
  const p = new Pool();
  assert.equal(p.offer(snap({ fence: 5, seq: 1 })), "applied");
  assert.equal(p.offer(snap({ fence: 4, seq: 2 })), "fenced");
  assert.equal(p.offer(snap({ fence: 5, seq: 1 })), "old");
  assert.equal(p.offer(snap({ fence: 5, seq: 2 })), "applied");
  assert.deepEqual([p.applied, p.fenced, p.ignored, p.snap.seq], [2, 1, 1, 2]);
});

const b = (backend, state, weight, o) => ({ backend, state, weight, priority: 0, open_until: null, ...o });
const known = new Set(["a", "b", "c"]);

test("weights: open gets nothing, half_open keeps its trickle, unknown ids are skipped", () => {
  const s = snap({ backends: [b("a", "closed", 1), b("b", "open", 0), b("c", "half_open", 0.05), b("x", "closed", 1)] });
  assert.deepEqual(weights(s, known, now), [{ backend: "a", weight: 1 }, { backend: "c", weight: 0.05 }]);
});

test("weights: all open sheds or spreads", () => {
  const bs = [b("a", "open", 0), b("b", "open", 0)];
  assert.deepEqual(weights(snap({ backends: bs }), known, now), []);
  assert.equal(weights(snap({ backends: bs, all_open: "spread" }), known, now).length, 2);
});

test("weights: stale snapshot keeps future breakers, equal weights otherwise", () => {
  const later = now + 60_000;
  const s = snap({ at: "2026-12-02T07:40:00.000Z", backends: [
    b("a", "closed", 0.3), b("b", "open", 0, { open_until: new Date(later).toISOString() }),
    b("c", "open", 0, { open_until: "2026-12-02T07:41:00.000Z" }),
  ] });
  assert.ok(isStale(s, now));
  assert.deepEqual(weights(s, known, now), [{ backend: "a", weight: 1 }, { backend: "c", weight: 1 }]);
});

test("weights: failover gives a half-open first tier its trickle", () => {
  const s = snap({ mode: "failover", backends: [b("a", "half_open", 0.05), b("b", "closed", 1, { priority: 1 })] });
  const w = weights(s, known, now);
  assert.equal(w[0].backend, "a");
  assert.ok(Math.abs(w[0].weight - 0.05) < 1e-9);
  assert.ok(Math.abs(w[1].weight - 0.95) < 1e-9);
});

test("pick is proportional to weight and never picks weight 0", () => {
  const ws = [{ backend: "a", weight: 1 }, { backend: "b", weight: 0 }, { backend: "c", weight: 3 }];
  assert.equal(pick(ws, () => 0.2), "a");
  assert.equal(pick(ws, () => 0.26), "c");
  assert.equal(pick(ws, () => 0.999999), "c");
  assert.equal(pick([{ backend: "a", weight: 0 }]), null);
});

test("outcomeOf follows the protocol's table", () => {
  const cases = [[200, "ok"], [429, "throttled"], [408, "timeout"], [504, "timeout"], [0, "timeout"],
    [499, "canceled"], [404, "client_error"], [503, "error"], [302, "error"]];
  for (const [s, want] of cases) assert.equal(outcomeOf(s), want, String(s));
});

test("shadowView: breakers ignores weights, observe ignores breakers, overrides stay", () => {
  const drain = { kind: "drain", reason: "r", who: "ops", until: "2026-12-02T09:00:00.000Z" };
  const bs = [b("a", "closed", 0.25), b("b", "open", 0, { open_until: "2026-12-02T07:51:00.000Z" }),
    b("c", "half_open", 0.05), b("d", "closed", 0, { override: drain })];
  const view = (mode) => shadowView(snap({ shadow: mode, backends: bs })).backends.map((x) => [x.backend, x.state, x.weight]);
  assert.deepEqual(view("breakers"), [["a", "closed", 1], ["b", "open", 0], ["c", "half_open", 0.05], ["d", "closed", 0]]);
  assert.deepEqual(view("observe"), [["a", "closed", 1], ["b", "closed", 1], ["c", "closed", 1], ["d", "closed", 0]]);
  const off = snap({ backends: bs });
  assert.equal(shadowView(off), off);
});

test("shadowPick follows the view and counts what the decisions would have done", () => {
  const s = snap({ shadow: "observe", backends: [b("a", "closed", 1), b("b", "open", 0)] });
  const ab = new Set(["a", "b"]);
  const stats = { picks: 0, differed: 0, excluded: 0 };
  assert.equal(shadowPick(s, ab, now, stats, () => 0.75), "b"); // the open b, observed
  assert.equal(shadowPick(s, ab, now, stats, () => 0.25), "a");
  assert.deepEqual(stats, { picks: 2, differed: 1, excluded: 1 });
  const off = { picks: 0, differed: 0, excluded: 0 };
  assert.equal(shadowPick(snap({ backends: s.backends }), ab, now, off, () => 0.75), "a");
  assert.deepEqual(off, { picks: 0, differed: 0, excluded: 0 });
});

test("retryAfterMs reads the stated wait as fleetwatch.ParseRetryHint does from headers", () => {
  const t = Date.parse("2026-12-02T08:00:00.000Z");
  const cases = [
    ["retry-after-ms first", 429, { "retry-after-ms": "1500", "retry-after": "9" }, 1500],
    ["Retry-After seconds", 429, { "retry-after": "2" }, 2000],
    ["Retry-After fraction", 429, { "retry-after": "0.5" }, 500],
    ["Retry-After HTTP date", 429, { "retry-after": "Wed, 02 Dec 2026 08:00:03 GMT" }, 3000],
    ["Retry-After date past", 429, { "retry-after": "Wed, 02 Dec 2026 07:59:00 GMT" }, 0],
    ["malformed skipped", 429, { "retry-after-ms": "-5", "retry-after": "soon" }, 0],
    ["on a 503 too", 503, { "retry-after": "30" }, 30000],
    ["capped at an hour", 429, { "retry-after": "86400" }, 3_600_000],
    ["OpenAI: the exhausted limit's reset", 429,
      { "x-ratelimit-reset-requests": "6m0s", "x-ratelimit-reset-tokens": "20ms", "x-ratelimit-remaining-tokens": "0" }, 20],
    ["OpenAI: the larger when none says", 429, { "x-ratelimit-reset-requests": "1m30.5s", "x-ratelimit-reset-tokens": "1s" }, 90500],
    ["OpenAI: plain seconds", 429, { "x-ratelimit-reset-tokens": "0.5" }, 500],
    ["reset headers only on a 429", 200, { "x-ratelimit-reset-requests": "6m0s" }, 0],
    ["reset headers not on a 503", 503, { "x-ratelimit-reset-requests": "6m0s" }, 0],
    ["Anthropic: RFC 3339", 429, { "anthropic-ratelimit-tokens-reset": "2026-12-02T08:00:10Z" }, 10000],
    ["bare 429: none", 429, {}, 0],
  ];
  for (const [name, status, headers, want] of cases) assert.equal(retryAfterMs(status, headers, t), want, name);
});
