// A thin HTTP router in Node that follows fleetwatch's decisions for one
// pool and publishes an outcome event per proxied request, with nothing
// but the nats client: the wire contract is docs/PROTOCOL.md.
//
//   NATS_URL=nats://127.0.0.1:4222 POOL=llama \
//   BACKENDS=gpu-a=http://10.0.0.1:8000,gpu-b=http://10.0.0.2:8000 \
//   node router.js
//
// Environment:
//   NATS_URL   the NATS server (default nats://127.0.0.1:4222)
//   FW_PREFIX  the deployment's subject prefix (default fw)
//   POOL       the pool id this router serves
//   BACKENDS   id=url,... : the backends it can reach (ids as in the events)
//   LISTEN     host:port to listen on (default 127.0.0.1:8090; port 0: any)
//   SOURCE     the events' source (default node-router)
//
// It reads the pool's last snapshot from the KV bucket at start, follows
// <prefix>.decisions.<pool>, and answers GET /fw/state with what it applied.
//
// A 429 (or 5xx) answer's event carries retry_after_ms when the answer
// states a wait in its headers (Retry-After, retry-after-ms, OpenAI's and
// Anthropic's reset headers; decisions.js retryAfterMs). That is what tells
// fleetwatch a quota from a full queue: a backend whose 429s carry it is
// opened after five in a row, while bare 429s only lower its weight unless
// it refuses nearly everything while its peers serve (docs/INTEGRATIONS.md
// "Retry hints").
"use strict";

const http = require("node:http");
const { connect, JSONCodec } = require("nats");
const { Pool, isStale, weights, shadowView, shadowPick, outcomeOf, retryAfterMs } = require("./decisions");

const natsURL = process.env.NATS_URL || "nats://127.0.0.1:4222";
const prefix = process.env.FW_PREFIX || "fw";
const poolId = process.env.POOL;
const source = process.env.SOURCE || "node-router";
const listen = process.env.LISTEN || "127.0.0.1:8090";
if (!poolId || !process.env.BACKENDS) {
  console.error("node-router: set POOL and BACKENDS (id=url,...)");
  process.exit(2);
}
const backends = new Map(
  process.env.BACKENDS.split(",").map((kv) => {
    const i = kv.indexOf("=");
    return [kv.slice(0, i), new URL(kv.slice(i + 1))];
  }),
);
const known = new Set(backends.keys());

// Names derived from the prefix (docs/PROTOCOL.md "Names under another
// prefix"): fw -> fw_decisions, acme.fw -> acme_fw_decisions.
const bucket = prefix.replaceAll(".", "_").toLowerCase() + "_decisions";
const decisionsSubject = `${prefix}.decisions.${poolId}`;
const outcomesSubject = `${prefix}.outcomes.${source}`;

const jc = JSONCodec();
const pool = new Pool();

function apply(s, from) {
  if (s.v !== undefined && s.v !== 1) return;
  if (s.pool !== poolId) return;
  const r = pool.offer(s);
  if (from === "kv") console.log(`node-router: ${bucket}/${poolId} from KV: ${r} (epoch ${s.epoch} seq ${s.seq})`);
}

async function followDecisions(nc) {
  // Subscribe first, then read the KV, so that nothing published in
  // between is missed; ordering (Pool.offer) sorts out the overlap.
  const sub = nc.subscribe(decisionsSubject);
  try {
    const kv = await nc.jetstream().views.kv(bucket, { bindOnly: true });
    const e = await kv.get(poolId);
    if (e && e.operation === "PUT") apply(jc.decode(e.value), "kv");
    else console.log(`node-router: no ${poolId} in ${bucket} yet`);
  } catch (err) {
    console.log(`node-router: KV ${bucket} unavailable (${err.message}); following the subject only`);
  }
  (async () => {
    for await (const m of sub) {
      try {
        apply(jc.decode(m.data), "subject");
      } catch (err) {
        console.error(`node-router: bad snapshot: ${err.message}`);
      }
    }
  })();
}

// shadowStats counts the picks made in shadow mode (decisions.js shadowPick).
const shadowStats = { picks: 0, differed: 0, excluded: 0 };

function publishOutcome(nc, ev) {
  nc.publish(outcomesSubject, jc.encode({ v: 1, pool: poolId, source, ...ev }));
}

function proxy(nc, req, res) {
  const backend = shadowPick(pool.snap, known, Date.now(), shadowStats);
  if (backend === null) {
    // Every backend open and all_open: shed: fail fast.
    res.writeHead(503, { "x-fw-shed": "all-open" });
    res.end("no backend available\n");
    return;
  }
  const target = backends.get(backend);
  const start = performance.now();
  const ts = new Date().toISOString();
  let ttft = null;
  const headers = { ...req.headers, host: target.host };
  const up = http.request(
    { hostname: target.hostname, port: target.port, method: req.method, path: req.url, headers },
    (ur) => {
      // A 429's (or 5xx's) stated wait, taken when the headers come: it
      // tells a quota from a full queue (decisions.js retryAfterMs).
      const hint = ur.statusCode === 429 || ur.statusCode >= 500 ? retryAfterMs(ur.statusCode, ur.headers, Date.now()) : 0;
      res.writeHead(ur.statusCode, { ...ur.headers, "x-fw-backend": backend });
      ur.on("data", (chunk) => {
        if (ttft === null) ttft = performance.now() - start;
        res.write(chunk);
      });
      ur.on("end", () => {
        res.end();
        const duration = performance.now() - start;
        publishOutcome(nc, {
          backend,
          ts,
          status: ur.statusCode,
          outcome: outcomeOf(ur.statusCode),
          ttft_ms: Math.min(ttft ?? duration, duration),
          duration_ms: duration,
          ...(hint > 0 && { retry_after_ms: hint }),
        });
      });
      ur.on("error", () => res.destroy());
    },
  );
  up.setTimeout(60_000, () => up.destroy(new Error("timeout")));
  up.on("error", (err) => {
    if (!res.headersSent) {
      res.writeHead(502, { "x-fw-backend": backend });
      res.end(`backend ${backend}: ${err.message}\n`);
    }
    // No answer came: status 0 (a timeout or a connect error).
    publishOutcome(nc, { backend, ts, status: 0, outcome: err.message === "timeout" ? "timeout" : "error" });
  });
  req.pipe(up);
}

function state(res) {
  const s = pool.snap;
  const body = {
    pool: poolId,
    epoch: s?.epoch ?? null,
    seq: s?.seq ?? null,
    fence: s?.fence ?? 0,
    at: s?.at ?? null,
    stale: s ? isStale(s, Date.now()) : null,
    applied: pool.applied,
    ignored: pool.ignored,
    fenced: pool.fenced,
    states: Object.fromEntries((s?.backends ?? []).map((b) => [b.backend, b.state])),
    weights: weights(shadowView(s), known, Date.now()),
    shadow: { mode: s?.shadow ?? "off", ...shadowStats },
  };
  res.writeHead(200, { "content-type": "application/json" });
  res.end(JSON.stringify(body));
}

async function main() {
  const nc = await connect({ servers: natsURL, name: source });
  await followDecisions(nc);
  const server = http.createServer((req, res) => {
    if (req.method === "GET" && req.url === "/fw/state") return state(res);
    proxy(nc, req, res);
  });
  const i = listen.lastIndexOf(":");
  server.listen(Number(listen.slice(i + 1)), listen.slice(0, i), () => {
    const a = server.address();
    console.log(`node-router: listening on http://${a.address}:${a.port} (pool ${poolId})`);
  });
  const stop = async () => {
    server.close();
    server.closeAllConnections();
    await nc.drain();
    process.exit(0);
  };
  process.on("SIGTERM", stop);
  process.on("SIGINT", stop);
}

main().catch((err) => {
  console.error(`node-router: ${err.message}`);
  process.exit(1);
});
