// fleetwatch status page. Polls /api/status once a second and renders it with
// DOM calls only: every text from the server goes through textContent, never
// through an HTML parser, because backend ids and reasons are arbitrary strings.
"use strict";
(function () {
  const POLL_MS = 1000;
  const SPARK_POINTS = 180; // points per backend asked for: 3 minutes at 1 heartbeat/s
  const SPARK_W = 120, SPARK_H = 22;
  const SVG = "http://www.w3.org/2000/svg";

  const $ = (id) => document.getElementById(id);
  const state = {
    instance: "",
    since: 0,           // history_seq of the last response: the server sends newer points only
    maxPoints: SPARK_POINTS,
    series: new Map(),  // pool \0 backend -> {t, ewma, p95, ok, w, s}
    poolEls: new Map(), // pool -> {details, summary parts, tbody}
    collapsed: new Set(),
    last: null,
  };

  function el(tag, cls, text) {
    const e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined && text !== null) e.textContent = String(text);
    return e;
  }

  function fmtMs(v) {
    if (v === null || v === undefined) return "–";
    if (v >= 10000) return (v / 1000).toFixed(1) + "s";
    return (v >= 100 ? v.toFixed(0) : v.toFixed(1)) + "ms";
  }
  function fmtPct(v) {
    if (v === null || v === undefined) return "–";
    return (v * 100).toFixed(v >= 0.9995 || v === 0 ? 0 : 1) + "%";
  }
  function fmtInt(v) {
    return (v === null || v === undefined) ? "–" : Number(v).toLocaleString("en-US");
  }
  function ago(iso, nowMs) {
    if (!iso) return "";
    const s = Math.max(0, Math.round((nowMs - Date.parse(iso)) / 1000));
    if (s < 120) return s + "s ago";
    if (s < 7200) return Math.round(s / 60) + "m ago";
    if (s < 172800) return Math.round(s / 3600) + "h ago";
    return Math.round(s / 86400) + "d ago";
  }

  function until(iso, nowMs) {
    const s = Math.round((Date.parse(iso) - nowMs) / 1000);
    if (s <= 0) return "due now";
    if (s < 120) return "in " + s + "s";
    if (s < 7200) return "in " + Math.round(s / 60) + "m";
    if (s < 172800) return "in " + Math.round(s / 3600) + "h";
    return "in " + Math.round(s / 86400) + "d";
  }

  // mergeSeries appends the points newer than what is held, then trims to the
  // server's bound so a long-open page does not grow.
  function mergeSeries(key, add) {
    let cur = state.series.get(key);
    if (!cur) {
      cur = { t: [], ewma: [], p95: [], ok: [], w: [], s: [] };
      state.series.set(key, cur);
    }
    if (!add || !add.t) return cur;
    const last = cur.t.length ? cur.t[cur.t.length - 1] : -Infinity;
    for (let i = 0; i < add.t.length; i++) {
      if (add.t[i] <= last) continue;
      for (const f of ["t", "ewma", "p95", "ok", "w", "s"]) cur[f].push(add[f][i]);
    }
    const extra = cur.t.length - state.maxPoints;
    if (extra > 0) for (const f of ["t", "ewma", "p95", "ok", "w", "s"]) cur[f].splice(0, extra);
    return cur;
  }

  // pathOf draws ys (null = gap) as an SVG path over the x range of ts.
  function pathOf(ts, ys, lo, hi) {
    if (ts.length === 0) return "";
    const t0 = ts[0], t1 = ts[ts.length - 1], span = Math.max(1, t1 - t0);
    const range = hi - lo || 1;
    let d = "", pen = false;
    for (let i = 0; i < ts.length; i++) {
      const y = ys[i];
      if (y === null || y === undefined || !isFinite(y)) { pen = false; continue; }
      const px = ((ts[i] - t0) / span) * (SPARK_W - 2) + 1;
      const py = SPARK_H - 1 - ((Math.min(Math.max(y, lo), hi) - lo) / range) * (SPARK_H - 2);
      d += (pen ? "L" : "M") + px.toFixed(1) + " " + py.toFixed(1);
      pen = true;
    }
    return d;
  }

  function sparkline(ser) {
    const svg = document.createElementNS(SVG, "svg");
    svg.setAttribute("class", "spark");
    svg.setAttribute("width", SPARK_W);
    svg.setAttribute("height", SPARK_H);
    svg.setAttribute("viewBox", "0 0 " + SPARK_W + " " + SPARK_H);
    const n = ser.t.length;
    if (n === 0) return svg;
    const t0 = ser.t[0], span = Math.max(1, ser.t[n - 1] - t0);
    // Red bands where the breaker was open.
    for (let i = 0; i < n; i++) {
      if (ser.s[i] !== 2) continue;
      let j = i;
      while (j + 1 < n && ser.s[j + 1] === 2) j++;
      const x0 = ((ser.t[i] - t0) / span) * (SPARK_W - 2) + 1;
      const x1 = ((ser.t[j] - t0) / span) * (SPARK_W - 2) + 1;
      const r = document.createElementNS(SVG, "rect");
      r.setAttribute("class", "openband");
      r.setAttribute("x", x0.toFixed(1));
      r.setAttribute("y", "0");
      r.setAttribute("width", Math.max(1.5, x1 - x0).toFixed(1));
      r.setAttribute("height", SPARK_H);
      svg.appendChild(r);
      i = j;
    }
    let hi = 0;
    for (const v of ser.ewma) if (v !== null && v > hi) hi = v;
    const ttft = document.createElementNS(SVG, "path");
    ttft.setAttribute("class", "ttft");
    ttft.setAttribute("d", pathOf(ser.t, ser.ewma, 0, hi * 1.1 || 1));
    const ok = document.createElementNS(SVG, "path");
    ok.setAttribute("class", "ok");
    ok.setAttribute("d", pathOf(ser.t, ser.ok, 0, 1));
    svg.appendChild(ttft);
    svg.appendChild(ok);
    const title = document.createElementNS(SVG, "title");
    title.textContent = "last " + Math.round(span / 1000) + "s: TTFT EWMA (blue, 0–" + fmtMs(hi) + "), success rate (green, 0–100%), open (red)";
    svg.appendChild(title);
    return svg;
  }

  function matches(filter, pool, b) {
    if (!filter) return true;
    const o = b.override;
    const hay = (pool + " " + b.backend + " " + b.state + " " + b.drift + " " + (b.reason || "") +
      (o ? " override " + o.kind + " " + (o.who || "") + " " + (o.reason || "") : "")).toLowerCase();
    return filter.split(/\s+/).every((w) => hay.includes(w));
  }

  function poolElements(name) {
    let p = state.poolEls.get(name);
    if (p) return p;
    const details = el("details", "pool");
    details.open = !state.collapsed.has(name);
    details.addEventListener("toggle", () => {
      if (details.open) state.collapsed.delete(name); else state.collapsed.add(name);
    });
    const summary = el("summary");
    const title = el("span", "name", name);
    const shadow = el("span", "shadow");
    shadow.hidden = true;
    const counts = el("span", "muted");
    const meta = el("span", "muted");
    summary.append(title, shadow, counts, meta);
    const table = el("table");
    const head = el("tr");
    for (const [h, cls] of [["backend", "id"], ["state"], ["weight"], ["EWMA TTFT"], ["p95 TTFT"], ["p95 TPOT"], ["success"], ["429"], ["requests"], ["drift"], ["override", "override"], ["last minutes"], ["last change", "reason"]]) {
      head.appendChild(el("th", cls || "", h));
    }
    const thead = el("thead");
    thead.appendChild(head);
    const tbody = el("tbody");
    table.append(thead, tbody);
    details.append(summary, table);
    p = { details, shadow, counts, meta, tbody };
    state.poolEls.set(name, p);
    return p;
  }

  // SHADOW_TEXT says what a router that knows the pool's shadow mode
  // follows (docs/PROTOCOL.md "Shadow mode (extension)").
  const SHADOW_TEXT = {
    breakers: "decisions are advisory: routers follow the breakers only (open backends get nothing, weights are ignored) and count what they would have done differently",
    observe: "decisions are advisory: routers follow nothing fleetwatch judged (only operator overrides) and count what they would have done differently",
  };

  // renderShadow shows a pool's shadow mode as a badge next to its name.
  function renderShadow(els, mode) {
    const on = mode === "breakers" || mode === "observe";
    els.shadow.hidden = !on;
    els.shadow.textContent = on ? "shadow: " + mode : "";
    els.shadow.dataset.shadow = on ? mode : "";
    els.shadow.title = on ? SHADOW_TEXT[mode] : "";
    els.details.dataset.shadow = on ? mode : "off";
  }

  // overrideCell shows the operator override in force on a backend: its
  // kind (and weight), who set it, until when, and why.
  function overrideCell(b, nowMs) {
    const td = el("td", "override");
    const o = b.override;
    if (!o) {
      td.textContent = "–";
      return td;
    }
    td.dataset.kind = o.kind;
    const kind = el("span", "okind", o.kind.replace("_", " ") + (o.kind === "weight" && o.weight !== undefined && o.weight !== null ? " " + Number(o.weight).toFixed(2) : ""));
    kind.dataset.kind = o.kind;
    const who = el("span", "owho", "by " + (o.who || "unknown"));
    const end = new Date(o.until);
    const soon = Math.abs(end.getTime() - nowMs) < 86400000;
    const till = el("span", "ountil", "until " + (soon ? end.toLocaleTimeString() : end.toLocaleString()) + " (" + until(o.until, nowMs) + ")");
    till.title = o.until;
    const why = el("span", "oreason", o.reason || "");
    td.append(kind, document.createTextNode(" "), who, document.createTextNode(" "), till, document.createTextNode(": "), why);
    return td;
  }

  // budgetNotes maps pool NUL backend to what the probe budget skipped in
  // the backend's last cycle (renderPools fills it from probe_budgets).
  let budgetNotes = new Map();

  function backendRow(pool, b, nowMs) {
    const tr = el("tr");
    tr.dataset.pool = pool;
    tr.dataset.backend = b.backend;
    tr.dataset.state = b.state;
    if (b.override) tr.dataset.override = b.override.kind;
    const id = el("td", "id", b.backend);
    id.title = b.backend;
    const st = el("span", "state", b.quota_until ? "out of quota" : b.state);
    st.dataset.state = b.state;
    if (b.quota_until) st.dataset.quota = "1";
    const stTd = el("td");
    stTd.appendChild(st);
    if (b.quota_until) stTd.title = "out of quota until " + b.quota_until + " (its provider's retry hint)";
    else if (b.state === "open" && b.open_until) stTd.title = "open until " + b.open_until;
    const wTd = el("td");
    const bar = el("span", "bar");
    const fill = el("span");
    fill.style.width = (Math.max(0, Math.min(1, b.weight)) * 100).toFixed(0) + "%";
    bar.appendChild(fill);
    wTd.append(bar, document.createTextNode(b.weight.toFixed(2)));
    const note = budgetNotes.get(pool + "\u0000" + b.backend);
    const drift = el("td", "drift", b.drift + (note ? " (" + note + ")" : ""));
    drift.dataset.drift = b.drift;
    const spark = el("td");
    spark.appendChild(sparkline(mergeSeries(pool + "\u0000" + b.backend, b.series)));
    const why = el("td", "reason");
    const lc = b.last_change;
    const when = b.since || (lc && lc.at);
    if (when) {
      const w = el("span", "muted", ago(when, nowMs) + " ");
      w.title = when;
      why.appendChild(w);
    }
    why.appendChild(document.createTextNode(b.reason || (lc && lc.reason) || ""));
    tr.append(id, stTd, wTd, el("td", "", fmtMs(b.ewma_ttft_ms)), el("td", "", fmtMs(b.p95_ttft_ms)),
      el("td", "tpot", fmtMs(b.p95_tpot_ms)),
      el("td", "", fmtPct(b.success_rate)), el("td", "", fmtPct(b.rate_429)), el("td", "", fmtInt(b.requests)),
      drift, overrideCell(b, nowMs), spark, why);
    return tr;
  }

  function renderPools(data) {
    budgetNotes = new Map((data.probe_budgets || []).filter((x) => x.note).map((x) => [x.pool + "\u0000" + x.backend, x.note]));
    const main = $("pools");
    const filter = $("filter").value.trim().toLowerCase();
    const unhealthy = $("unhealthy").checked;
    const nowMs = data.now ? Date.parse(data.now) : Date.now();
    const seen = new Set();
    const seenKeys = new Set();
    const order = [];
    for (const p of data.pools || []) {
      seen.add(p.pool);
      const els = poolElements(p.pool);
      const n = { closed: 0, half_open: 0, open: 0 };
      const rows = [];
      for (const b of p.backends || []) {
        n[b.state] = (n[b.state] || 0) + 1;
        seenKeys.add(p.pool + "\u0000" + b.backend);
        const row = backendRow(p.pool, b, nowMs);
        if (unhealthy && b.state === "closed" && !b.override && (b.drift === "ok" || b.drift === "unknown")) continue;
        if (!matches(filter, p.pool, b)) continue;
        rows.push(row);
      }
      els.tbody.replaceChildren(...rows);
      els.counts.textContent = (p.backends || []).length + " backends: " + n.closed + " closed, " + n.half_open + " half-open, " + n.open + " open";
      renderShadow(els, p.shadow);
      els.meta.textContent = p.mode + ", all open: " + p.all_open + ", median EWMA " + fmtMs(p.median_ewma_ttft_ms) + ", seq " + p.seq + ", " + ago(p.at, nowMs);
      els.details.dataset.stale = p.stale ? "true" : "false";
      els.details.hidden = rows.length === 0 && (filter !== "" || unhealthy);
      order.push(els.details);
    }
    for (const [name, els] of state.poolEls) {
      if (!seen.has(name)) state.poolEls.delete(name);
    }
    // Forget the history of backends that left their pool.
    for (const key of state.series.keys()) {
      if (!seenKeys.has(key)) state.series.delete(key);
    }
    if (order.length === 0) {
      main.replaceChildren(el("p", "muted", "no pools yet: waiting for outcome events"));
    } else {
      main.replaceChildren(...order);
    }
  }

  function renderSummary(data) {
    const nowMs = data.now ? Date.parse(data.now) : Date.now();
    const ing = data.ingest || {};
    const dl = $("ingest");
    const items = [["received", ing.received], ["accepted", ing.accepted], ["rejected", ing.rejected], ["skewed", ing.skewed], ["dropped", ing.dropped]];
    if (ing.mode === "core + capture") items.push(["caught up", ing.capture_replayed || 0], ["not caught up", ing.capture_unreplayed || 0], ["lost period (s)", ing.capture_uncovered_seconds || 0]);
    if (ing.mode === "durable intake") items.push(["lost in intake", ing.intake_lost || 0]);
    const prev = state.last && state.last.ingest;
    const dt = state.last ? (nowMs - Date.parse(state.last.now)) / 1000 : 0;
    const nodes = [];
    for (const [k, v] of items) {
      let txt = fmtInt(v);
      if (prev && dt > 0 && k === "accepted") txt += " (" + Math.max(0, (v - prev[k]) / dt).toFixed(0) + "/s)";
      nodes.push(el("dt", "", k), el("dd", "", txt));
    }
    if (ing.mode) {
      const dd = el("dd", "", ing.mode);
      dd.title = ing.loss || "";
      nodes.push(el("dt", "", "kept while down"), dd);
    }
    dl.replaceChildren(...nodes);

    const rej = (data.top_rejects || []).map((r) => el("li", "", r.reason + ": " + fmtInt(r.count)));
    $("rejects").replaceChildren(...(rej.length ? rej : [el("li", "muted", "none")]));

    $("review").textContent = data.next_review ? "next review " + until(data.next_review, nowMs) + " (" + new Date(data.next_review).toLocaleString() + ")" : "no review scheduled";
    const alerts = (data.drift_alerts || []).map((a) => {
      const li = el("li", "drift", a.pool + " / " + a.backend + ": " + a.previous + " → " + a.status + " (score " + Number(a.score).toFixed(2) + ", " + ago(a.at, nowMs) + ") " + (a.reason || ""));
      li.dataset.drift = a.status;
      return li;
    });
    $("alerts").replaceChildren(...(alerts.length ? alerts : [el("li", "muted", "no drift alerts")]));
    const budgets = (data.probe_budgets || []).map((x) => {
      const li = el("li", x.note ? "drift" : "", x.pool + " / " + x.backend + ": " + x.summary);
      if (x.note) li.dataset.drift = "suspect";
      return li;
    });
    $("budgets").replaceChildren(...(budgets.length ? budgets : [el("li", "muted", "no probe budget or spend")]));

    const tr = (data.transitions || []).map((t) => {
      const li = el("li", "", ago(t.at, nowMs) + " " + t.pool + " / " + t.backend + ": " + t.from + " → " + t.to + (t.reason ? " — " + t.reason : ""));
      li.title = t.at;
      return li;
    });
    $("transitions").replaceChildren(...(tr.length ? tr : [el("li", "muted", "none yet")]));
  }

  function render(data) {
    if (data.max_points) state.maxPoints = data.max_points;
    renderPools(data);
    renderSummary(data);
    $("updated").textContent = "updated " + new Date(data.now || Date.now()).toLocaleTimeString();
    state.last = data;
  }

  async function poll() {
    if (document.hidden) {
      // A background tab asks for nothing; the next visible poll gets every
      // point it missed (within the server's bound) through ?since=.
      setTimeout(poll, POLL_MS);
      return;
    }
    try {
      const res = await fetch("api/status?since=" + state.since + "&points=" + SPARK_POINTS, { cache: "no-store" });
      if (!res.ok) throw new Error("HTTP " + res.status);
      const data = await res.json();
      if (state.instance !== "" && data.instance !== state.instance) {
        // A restarted server: its history starts over, ask for all of it.
        state.instance = "";
        state.since = 0;
        state.series.clear();
        setTimeout(poll, 0);
        return;
      }
      state.instance = data.instance;
      render(data);
      state.since = data.history_seq || 0;
      $("conn").dataset.state = "live";
      $("conn").textContent = "live";
    } catch (e) {
      $("conn").dataset.state = "down";
      $("conn").textContent = "disconnected";
      $("conn").title = String(e && e.message || e);
    }
    setTimeout(poll, POLL_MS);
  }

  function rerender() { if (state.last) { renderPools(state.last); } }
  $("filter").addEventListener("input", rerender);
  $("unhealthy").addEventListener("change", rerender);
  $("expand").addEventListener("click", () => { state.collapsed.clear(); for (const p of state.poolEls.values()) p.details.open = true; });
  $("collapse").addEventListener("click", () => { for (const [n, p] of state.poolEls) { state.collapsed.add(n); p.details.open = false; } });
  poll();
})();
