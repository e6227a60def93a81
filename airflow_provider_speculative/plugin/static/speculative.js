/* Run and stage views of the speculative provider: poll the plugin's JSON endpoints and re-render. */
"use strict";

(function () {
  const params = new URLSearchParams(window.location.search);
  const DAG_ID = params.get("dag_id") || "";
  const RUN_ID = params.get("run_id") || "";
  const TASK_ID = params.get("task_id") || "";
  const NOT_FOUND_RETRY_MS = 5000;

  /* An absolute http(s) URL, else null: a link's scheme survives any escaping (a script or data URL), so
     every href is checked here whatever the server sent. Relative links resolve against this page. */
  function safeUrl(value) {
    if (typeof value !== "string" || !value) return null;
    try {
      const url = new URL(value, window.location.href);
      return url.protocol === "http:" || url.protocol === "https:" ? url.href : null;
    } catch (err) {
      return null;
    }
  }
  const URL_ATTRS = new Set(["href", "src", "xlink:href", "action", "formaction"]);

  /* h("div", {class: "x"}, "text", child...) -> element; text is never parsed as HTML, event-handler
     attributes are refused and a URL attribute that is not http(s) is dropped. */
  function h(tag, attrs, ...children) {
    const svg = ["svg", "g", "rect", "text", "path", "line", "title", "a", "tspan", "defs", "marker"].includes(tag)
      && (attrs && attrs.svg);
    const el = svg ? document.createElementNS("http://www.w3.org/2000/svg", tag) : document.createElement(tag);
    for (const [key, value] of Object.entries(attrs || {})) {
      if (key === "svg" || value === null || value === undefined || value === false) continue;
      if (/^on/i.test(key)) continue;  // never an inline handler: the CSP would block it anyway
      if (key === "style" && typeof value === "object") Object.assign(el.style, value);
      else if (URL_ATTRS.has(key.toLowerCase())) {
        const url = safeUrl(String(value));
        if (url) el.setAttribute(key, url);
      } else el.setAttribute(key, value === true ? "" : String(value));
    }
    for (const child of children.flat()) {
      if (child === null || child === undefined || child === false) continue;
      el.appendChild(child instanceof Node ? child : document.createTextNode(String(child)));
    }
    return el;
  }
  const s = (tag, attrs, ...children) => h(tag, Object.assign({svg: true}, attrs), ...children);

  function seconds(value) {
    if (value === null || value === undefined) return "-";
    if (value < 60) return value.toFixed(1) + " s";
    const m = Math.floor(value / 60), sec = Math.round(value % 60);
    if (m < 60) return `${m}m ${sec}s`;
    return `${Math.floor(m / 60)}h ${m % 60}m`;
  }
  function clock(epoch) {
    return epoch ? new Date(epoch * 1000).toLocaleTimeString([], {hour12: false}) : "-";
  }
  function datetime(epoch) {
    return epoch ? new Date(epoch * 1000).toLocaleString([], {hour12: false}) : "-";
  }
  function setLive(state, text) {
    const live = document.getElementById("live");
    live.dataset.state = state;
    live.textContent = text;
  }
  function query(extra) {
    const q = new URLSearchParams({dag_id: DAG_ID, run_id: RUN_ID});
    for (const [k, v] of Object.entries(extra || {})) q.set(k, v);
    return q.toString();
  }
  function stageHref(stage) {
    return "stage?" + query({task_id: stage});
  }

  /* Fetch `url` (a string, or a function giving one) every refresh_seconds and render, until the payload
     says done. Returns a function that fetches again at once (e.g. for another page of subtasks). */
  function poll(url, render) {
    const root = document.getElementById("content");
    let refreshes = 0;
    let timer = null;
    let generation = 0;  // a tick started before refresh() drops its answer: one poll loop at a time
    async function tick() {
      const mine = generation;
      let response;
      try {
        response = await fetch(typeof url === "function" ? url() : url,
                               {credentials: "same-origin", headers: {Accept: "application/json"},
                                cache: "no-store"});
      } catch (err) {
        if (mine !== generation) return;
        setLive("error", "cannot reach the api-server; retrying");
        timer = window.setTimeout(tick, NOT_FOUND_RETRY_MS);
        return;
      }
      if (mine !== generation) return;
      if (response.status === 401 || response.status === 403) {
        setLive("error", response.status === 401 ? "session expired: reload the page to log in again"
                                                 : "you may not read this DAG");
        root.replaceChildren(h("p", {class: "message"}, "Not authorized (" + response.status + ")."));
        return;
      }
      if (response.status === 404) {
        const body = await response.json().catch(() => ({}));
        const detail = typeof body.detail === "object" && body.detail ? body.detail : {message: body.detail};
        root.replaceChildren(h("p", {class: "message", id: "not-found"},
                               detail.message || "Nothing recorded for this run yet."));
        if (detail.done) {
          document.body.dataset.done = "true";
          setLive("done", "nothing recorded, and the run has finished (" + detail.run_state + ")");
          return;
        }
        setLive("live", "nothing recorded yet; checking again");
        timer = window.setTimeout(tick, NOT_FOUND_RETRY_MS);
        return;
      }
      if (!response.ok) {
        setLive("error", "error " + response.status + "; retrying");
        timer = window.setTimeout(tick, NOT_FOUND_RETRY_MS);
        return;
      }
      const data = await response.json();
      if (mine !== generation) return;
      refreshes += 1;
      document.body.dataset.refreshes = String(refreshes);
      root.replaceChildren(render(data));
      if (data.done) {
        document.body.dataset.done = "true";
        setLive("done", "finished" + (data.run_state ? " (run " + data.run_state + ")" : "")
                + ": auto-refresh stopped at " + clock(data.now));
      } else {
        setLive("live", "live: refreshing every " + data.refresh_seconds + " s (last " + clock(data.now) + ")");
        timer = window.setTimeout(tick, data.refresh_seconds * 1000);
      }
    }
    tick();
    return function refresh() {
      generation += 1;
      window.clearTimeout(timer);
      tick();
    };
  }

  function card(id, label, value, title) {
    return h("div", {class: "card", id: id ? "metric-" + id : null, title: title || null},
             h("div", {class: "label"}, label), h("div", {class: "value"}, value));
  }

  /* ---------------------------------------------------------------- stage view */

  function renderStage(d) {
    const frag = document.createDocumentFragment();
    document.title = "Stage " + d.stage;
    frag.append(
      h("h1", null, "Stage " + d.stage, h("span", {class: "state " + d.state, id: "stage-state"}, d.state)),
      h("div", {class: "sub"}, `DAG ${d.dag_id} · run ${d.run_id} · `,
        h("a", {href: "run?" + query(), id: "run-link"}, "all stages of this run")),
      h("div", {class: "cards"},
        card("progress", "admitted / parallelism", `${d.progress.admitted} / ${d.progress.parallelism}`),
        card("speculation", "speculation", d.speculation_blocker ? "blocked" : (d.speculation || "-"),
             d.speculation_blocker || null),
        // Words as labels; Flink's metric names (what metrics and the status JSON call them) in the tooltip.
        card("numSlowExecutionVertices", "slow subtasks now", d.numSlowExecutionVertices,
             "subtasks currently slower than the baseline (Flink metric numSlowExecutionVertices)"),
        card("numEffectiveSpeculativeExecutions", "copies that won", d.numEffectiveSpeculativeExecutions,
             "speculative attempts that finished first and were admitted " +
             "(Flink metric numEffectiveSpeculativeExecutions)"),
        card("baseline", "slow-task baseline", seconds(d.baseline_seconds),
             "an attempt running longer than this is slow"),
        card("attempts", "attempts (speculative)", `${d.attempts_total} (${d.speculative_attempts})`),
        card("peak", "peak slow subtasks", d.peakSlowExecutionVertices)),
    );
    frag.append(h("p", {class: "sub", id: "parallelism-decision"}, "parallelism: " + (d.parallelism_line || "fixed")));
    (d.plan_warnings || []).forEach(w => frag.append(h("p", {class: "message plan-warning"}, w)));
    (d.skew_splits || []).forEach(n => frag.append(h("p", {class: "sub skew-split"}, "skew: " + n)));
    // Hybrid inputs (FLIP-235): e.g. "3 subtasks waiting for producer partitions; subtask 2: ... 3/8 admitted".
    (d.input_waits || []).forEach(n => frag.append(h("p", {class: "sub input-wait"}, n)));
    // Speed-aware placement and the baseline's origin, e.g. "slow targets: local-b 4.0x (history); ...".
    if (d.speed_line) frag.append(h("p", {class: "sub", id: "speed-line"}, d.speed_line));
    if (d.speculation_blocker) {
      frag.append(h("p", {class: "message"}, "Speculation is off for this stage: " + d.speculation_blocker));
    }
    if (d.expired) {
      // gc removed the committed results (FLIP-1 life cycle): a consumer rerun would find them missing.
      const subs = Object.keys(d.expired.attempts || {});
      frag.append(h("p", {class: "message expired", id: "expired"},
        `Results expired: gc removed the committed output of ${subs.length} subtask(s) at ${datetime(d.expired.at)}`
        + (d.expired.reason ? ` (${d.expired.reason})` : "") + "; a consumer rerun would have to recompute them."));
    }
    frag.append(h("h2", null, "Attempts over time"), subtaskPager(d), legend(), timeline(d));
    if (d.breakdown_line) frag.append(h("p", {class: "sub", id: "breakdown-line"}, d.breakdown_line));
    frag.append(h("h2", null, "Slots"), slotTable(d));
    frag.append(h("h2", null, "Blocked nodes"), blockedTable(d));
    frag.append(h("h2", null, "Attempts"), attemptTable(d));
    frag.append(h("h2", null, "Controller events"), eventsTable(d.events, false));
    rerunPanel(d);
    return frag;
  }

  /* A big stage is served a page of subtasks at a time (offset, limit); totals by state cover all of them. */
  const subtaskPage = {offset: 0, limit: 500};
  let refreshStage = null;
  function subtaskPager(d) {
    const p = d.subtask_page, totals = d.subtask_totals || {};
    const box = h("div", {class: "sub pager", id: "subtask-pager"});
    if (!p) return box;
    const last = p.offset + p.count;
    box.append(h("span", {id: "subtask-range"},
                 p.count ? `subtasks ${p.offset}-${last - 1} of ${p.total}` : `no subtask here (${p.total} in all)`),
               " · ", h("span", {id: "subtask-totals"},
                        Object.entries(totals).map(([state, n]) => `${n} ${state}`).join(", ")));
    if (p.total <= p.count && p.offset === 0) return box;  // one page holds the stage
    const go = (offset) => {
      subtaskPage.offset = offset;
      if (refreshStage) refreshStage();
    };
    const prev = h("button", {type: "button", id: "subtasks-prev", disabled: p.offset === 0}, "previous");
    const next = h("button", {type: "button", id: "subtasks-next", disabled: last >= p.total}, "next");
    prev.addEventListener("click", () => go(Math.max(0, p.offset - subtaskPage.limit)));
    next.addEventListener("click", () => go(p.offset + subtaskPage.limit));
    box.append(" ", prev, " ", next);
    return box;
  }

  function legend() {
    const item = (cls, text) => h("span", null, h("i", {class: "swatch " + cls}), text);
    return h("div", {class: "legend"}, item("FINISHED", "finished"), item("RUNNING", "running"),
             item("FAILED", "failed"), item("CANCELED", "cancelled"), item("spec", "speculative attempt"),
             item("admitted", "admitted (committed) attempt"), item("baseline", "slow-task baseline"),
             ...["start", "app", "spark", "commit", "exit"].map(p => item("phase-" + p, p)));
  }

  function timeline(d) {
    const box = h("div", {class: "timeline", id: "timeline"});
    const t0 = d.window.start, t1 = Math.max(d.window.end || t0, (t0 || 0) + 1);
    if (!t0) {
      box.append(h("p", {class: "empty"}, "No attempt launched yet."));
    }
    const pct = (t) => Math.max(0, Math.min(100, (t - t0) / (t1 - t0) * 100));
    if (t0) {
      const ticks = h("div", {class: "track"});
      for (let i = 0; i <= 4; i++) {
        const left = i * 25;
        ticks.append(h("span", {class: "tick", style: {left: Math.min(left, 97) + "%"}},
                       i === 0 ? clock(t0) : "+" + seconds((t1 - t0) * i / 4)));
      }
      box.append(h("div", {class: "axis"}, h("span"), ticks));
    }
    const blocked = new Set(d.blocked.filter((b) => !b.expired).map((b) => b.node));
    for (const sub of d.subtasks) {
      const track = h("div", {class: "track"});
      const label = h("div", {class: "name"}, "subtask " + sub.subtask,
                      h("small", null, sub.reused ? "reused" : (sub.admitted !== null ? "admitted #" + sub.admitted
                                                                                      : "not admitted yet")));
      for (const a of sub.attempts) {
        const lane = h("div", {class: "lane"});
        const begin = a.start || a.created;
        if (t0 && begin) {
          const end = a.end || d.now;
          const flags = [a.speculative ? "speculative" : null, a.admitted ? "admitted" : null,
                         a.restart ? "restart" : null].filter(Boolean);
          const title = [`attempt ${a.attempt}: ${a.state}`, `target ${a.target}, node ${a.node || "?"}`,
                         `${clock(begin)} – ${a.end ? clock(a.end) : "now"} (${seconds(a.duration)})`,
                         a.reason ? "reason: " + a.reason : null, a.cause ? "cause: " + a.cause : null,
                         a.exit_code !== null ? "exit code " + a.exit_code : null].filter(Boolean).join("\n");
          lane.append(h("div", {
              class: ["attempt", a.state].concat(flags).join(" "), title: title,
              "data-subtask": sub.subtask, "data-attempt": a.attempt, "data-state": a.state,
              "data-admitted": String(a.admitted), "data-speculative": String(a.speculative),
              style: {left: pct(begin) + "%", width: Math.max(pct(end) - pct(begin), 0.3) + "%"}},
            `#${a.attempt} ${a.node || a.target}`,
            a.speculative ? h("span", {class: "tag badge-spec"}, "speculative") : null,
            a.admitted ? h("span", {class: "tag badge-admitted"}, "admitted") : null,
            a.restart ? h("span", {class: "tag badge-restart"}, "restart") : null,
            a.node && blocked.has(a.node) ? h("span", {class: "tag badge-blocked", title: "node is blocked"},
                                              "node blocked") : null));
          // Where the attempt's time went (core/breakdown.py), as segments on the same time axis.
          if (a.phases && a.start) {
            let at = a.start;
            for (const phase of ["start", "app", "spark", "commit", "exit"]) {
              const span = a.phases[phase];
              if (typeof span !== "number") continue;
              lane.append(h("div", {class: "phase phase-" + phase, "data-phase": phase,
                                    title: `${phase} ${seconds(span)}`,
                                    style: {left: pct(at) + "%", width: Math.max(pct(at + span) - pct(at), 0.1) + "%"}}));
              at += span;
            }
          }
          if (d.baseline_seconds && a.start && a.duration > d.baseline_seconds) {
            lane.append(h("div", {class: "baseline-tick", style: {left: pct(a.start + d.baseline_seconds) + "%"},
                                  title: "slow-task baseline " + seconds(d.baseline_seconds) + " after start"}));
          }
        }
        track.append(lane);
      }
      if (!sub.attempts.length) track.append(h("div", {class: "lane empty"}, sub.reused ? "reused result" : ""));
      box.append(h("div", {class: "subtask-row", "data-subtask": sub.subtask}, label, track));
    }
    return box;
  }

  // FLIP-159: what each target offered at the controller's last check; a waiting stage says why.
  function slotTable(d) {
    const frag = document.createDocumentFragment();
    if (d.slot_status) frag.append(h("p", {class: "message", id: "slot-status"}, d.slot_status));
    const names = Object.keys(d.slots || {}).sort();
    if (!names.length) {
      frag.append(h("p", {class: "empty", id: "slots"}, "No slot observation yet."));
      return frag;
    }
    frag.append(h("table", {id: "slots"},
      h("tr", null, h("th", null, "target"), h("th", null, "live"), h("th", null, "free"),
        h("th", null, "capacity"), h("th", null, "held (all stages)"), h("th", null, "workers / reason")),
      ...names.map(n => {
        const v = d.slots[n];
        return h("tr", {class: v.live ? "" : "lost"}, h("td", null, n), h("td", null, v.live ? "yes" : "LOST"),
          h("td", null, String(v.free)), h("td", null, String(v.capacity)), h("td", null, String(v.held)),
          h("td", null, v.live ? (v.nodes || []).join(", ") : (v.reason || "")));
      })));
    Object.keys(d.lost_nodes || {}).sort().forEach(n => frag.append(
      h("p", {class: "sub lost-node"}, `node ${n} lost: ${d.lost_nodes[n]}`)));
    return frag;
  }

  function blockedTable(d) {
    if (!d.blocked.length) return h("p", {class: "empty", id: "blocked-nodes"}, "No node is blocked.");
    return h("table", {id: "blocked-nodes"},
      h("tr", null, h("th", null, "node"), h("th", null, "blocked until"), h("th", null, "expires")),
      d.blocked.map((b) => h("tr", {"data-node": b.node}, h("td", null, b.node), h("td", null, datetime(b.until)),
                             h("td", null, b.expired ? "expired" : "in " + seconds(b.until - d.now)))));
  }

  function attemptTable(d) {
    const rows = [];
    for (const sub of d.subtasks) {
      for (const a of sub.attempts) {
        // A URL that is not http(s) gets no link at all (not an inert <a>): nothing to click.
        const ui = safeUrl(a.spark_ui), history = safeUrl(a.spark_history);
        const links = [h("a", {href: "log?" + query({task_id: TASK_ID, subtask: sub.subtask, attempt: a.attempt}),
                               class: "log-link"}, "log"),
                       ui ? h("a", {href: ui, target: "_blank", rel: "noopener noreferrer"}, "Spark UI") : null,
                       history ? h("a", {href: history, target: "_blank", rel: "noopener noreferrer"},
                                   "history") : null].filter(Boolean);
        rows.push(h("tr", {class: "attempt-row", "data-subtask": sub.subtask, "data-attempt": a.attempt},
          h("td", null, sub.subtask), h("td", null, a.attempt),
          h("td", null, h("span", {class: "state " + a.state}, a.state)),
          h("td", null, [a.speculative ? "speculative" : null, a.admitted ? "admitted" : null,
                         a.restart ? "restart" : null].filter(Boolean).join(", ") || "-"),
          h("td", null, a.target || "-"), h("td", null, a.node || "-"),
          h("td", null, clock(a.start)), h("td", null, clock(a.end)), h("td", null, seconds(a.duration)),
          h("td", {class: "heartbeat"}, a.heartbeat_age === null || a.heartbeat_age === undefined ? "-"
                                        : seconds(a.heartbeat_age) + " ago"),
          h("td", null, a.exit_code === null ? "-" : a.exit_code),
          h("td", {class: "wrap"}, [a.reason, a.cause].filter(Boolean).join("; ") || "-"),
          h("td", null, links.length ? links.flatMap((l, i) => i ? [" · ", l] : [l]) : "-")));
      }
    }
    return h("table", {id: "attempts"},
      h("tr", null, ["subtask", "attempt", "state", "flags", "target", "node", "start", "end", "duration", "heartbeat",
                     "exit", "reason / cause", "logs"].map((c) => h("th", null, c))),
      rows);
  }

  function describe(e) {
    const skip = new Set(["at", "event", "stage"]);
    return Object.entries(e).filter(([k]) => !skip.has(k)).map(([k, v]) => {
      if (k === "until") return "until " + datetime(v);
      return k + " " + (typeof v === "object" ? JSON.stringify(v) : v);
    }).join(", ");
  }

  function eventsTable(events, withStage) {
    if (!events.length) return h("p", {class: "empty"}, "Only launches and admissions so far.");
    return h("table", {class: "events"},
      h("tr", null, h("th", null, "time"), withStage ? h("th", null, "stage") : null, h("th", null, "event"),
        h("th", null, "details")),
      events.map((e) => h("tr", {"data-event": e.event}, h("td", null, clock(e.at)),
                          withStage ? h("td", null, e.stage) : null, h("td", null, e.event),
                          h("td", {class: "wrap"}, describe(e)))));
  }

  /* ---------------------------------------------------------------- run view */

  function renderRun(d) {
    const frag = document.createDocumentFragment();
    document.title = "Speculative stages of " + d.dag_id;
    const committed = d.stages.filter((st) => st.committed).length;
    frag.append(
      h("h1", null, "Speculative stages"),
      h("div", {class: "sub"}, `DAG ${d.dag_id} · run ${d.run_id} · ${committed} of ` +
        `${d.stages.length + d.pending_stages.length} stages committed`),
      h("div", {class: "graph", id: "stage-graph"}, graph(d)),
      h("h2", null, "Stages"), stageTable(d),
      h("h2", null, "Failover and reruns"), rerunSection(d));
    return frag;
  }

  function graph(d) {
    const W = 210, H = 92, GX = 120, GY = 28, PAD = 20;
    const nodes = new Map();
    const level = new Map();
    const stages = d.stages.concat(d.pending_stages.map((name) => ({stage: name, pending: true, upstreams: [],
                                                                    state: "waiting"})));
    const upstreamsOf = new Map(stages.map((st) => [st.stage, new Set(st.upstreams || [])]));
    for (const e of d.edges) if (upstreamsOf.has(e.to)) upstreamsOf.get(e.to).add(e.from);
    for (const st of d.stages) for (const c of st.consumers) if (upstreamsOf.has(c)) upstreamsOf.get(c).add(st.stage);
    const hasSources = d.sources.length > 0;
    function lvl(name, seen) {
      if (level.has(name)) return level.get(name);
      if (seen.has(name)) return 0;
      seen.add(name);
      const ups = [...(upstreamsOf.get(name) || [])].filter((u) => upstreamsOf.has(u));
      const value = ups.length ? Math.max(...ups.map((u) => lvl(u, seen))) + 1 : (hasSources ? 1 : 0);
      level.set(name, value);
      return value;
    }
    stages.forEach((st) => lvl(st.stage, new Set()));
    const columns = new Map();
    const place = (key, col, info) => {
      const row = (columns.get(col) || []).length;
      columns.set(col, (columns.get(col) || []).concat([key]));
      nodes.set(key, Object.assign({x: PAD + col * (W + GX), y: PAD + row * (H + GY)}, info));
    };
    d.sources.forEach((src) => place("source:" + src.stage + ":" + src.input, 0, {source: src}));
    stages.forEach((st) => place(st.stage, level.get(st.stage), {stage: st}));
    if (!nodes.size) return h("p", {class: "empty"}, "No stage planned yet.");
    const cols = Math.max(...[...columns.keys()]) + 1;
    const rows = Math.max(...[...columns.values()].map((c) => c.length));
    const width = PAD * 2 + cols * W + (cols - 1) * GX, height = PAD * 2 + rows * H + (rows - 1) * GY;
    const svg = s("svg", {viewBox: `0 0 ${width} ${height}`, style: {maxWidth: width + "px"}, role: "img",
                          "aria-label": "stage graph"});
    svg.append(s("defs", null, s("marker", {id: "arrow", viewBox: "0 0 10 10", refX: 10, refY: 5, markerWidth: 7,
                                            markerHeight: 7, orient: "auto-start-reverse"},
                                 s("path", {d: "M 0 0 L 10 5 L 0 10 z", fill: "currentColor"}))));
    const edge = (from, to, label, cls) => {
      const a = nodes.get(from), b = nodes.get(to);
      if (!a || !b) return;
      const x1 = a.x + W, y1 = a.y + H / 2, x2 = b.x, y2 = b.y + H / 2, mx = (x1 + x2) / 2;
      svg.append(s("g", {class: "edge-group", "data-from": from, "data-to": to},
        s("path", {class: "edge " + (cls || ""), d: `M ${x1} ${y1} C ${mx} ${y1}, ${mx} ${y2}, ${x2} ${y2}`,
                   "marker-end": "url(#arrow)"}),
        s("text", {class: "edge-label", x: mx, y: (y1 + y2) / 2 - 6, "text-anchor": "middle"}, label)));
    };
    d.sources.forEach((src) => edge("source:" + src.stage + ":" + src.input, src.stage,
                                    [src.kind, src.format].filter(Boolean).join(" · ")));
    d.edges.forEach((e) => edge(e.from, e.to, `${e.distribution} · ${e.mode}`, e.mode));
    for (const [key, n] of nodes) {
      const g = s("g", {class: "node " + (n.source ? "source" : n.stage.state), transform: `translate(${n.x},${n.y})`,
                        "data-stage": n.source ? null : key});
      g.append(s("rect", {width: W, height: H, rx: 8}));
      if (n.source) {
        g.append(s("text", {class: "title", x: 12, y: 24}, n.source.input),
                 s("text", {class: "muted", x: 12, y: 44}, "source of " + n.source.stage),
                 s("text", {class: "muted", x: 12, y: 62}, n.source.format || ""));
        svg.append(g);
        continue;
      }
      const st = n.stage;
      if (st.pending) {
        g.append(s("text", {class: "title", x: 12, y: 24}, st.stage),
                 s("text", {class: "muted", x: 12, y: 44}, "not planned yet"));
        svg.append(g);
        continue;
      }
      const frac = st.progress.parallelism ? st.progress.admitted / st.progress.parallelism : 0;
      g.append(
        s("text", {class: "title", x: 12, y: 22}, st.stage),
        s("text", {class: "muted", x: W - 12, y: 22, "text-anchor": "end"}, st.state),
        s("rect", {class: "bar-bg", x: 12, y: 32, width: W - 24, height: 8, rx: 4}),
        s("rect", {class: "bar", x: 12, y: 32, width: (W - 24) * frac, height: 8, rx: 4}),
        s("text", {x: 12, y: 58, class: "progress"}, `${st.progress.admitted}/${st.progress.parallelism} admitted`),
        s("text", {class: "muted", x: 12, y: 78},
          `${st.attempts_total} attempts · ${st.speculative_attempts} spec · ${(st.restarts_total ?? st.restarts.length)} restarts`));
      svg.append(s("a", {href: stageHref(st.stage)}, g));
    }
    return svg;
  }

  function stageTable(d) {
    return h("table", {id: "stages"},
      h("tr", null, [["stage"], ["state"], ["admitted / parallelism"], ["inputs"], ["attempts"], ["speculative"],
                     ["copies that won", "numEffectiveSpeculativeExecutions (Flink metric)"], ["restarts"],
                     ["blocked nodes"]].map(([c, tip]) => h("th", {title: tip || null}, c))),
      d.stages.map((st) => h("tr", {class: "stage-row", "data-stage": st.stage},
        h("td", null, h("a", {href: stageHref(st.stage)}, st.stage)),
        h("td", null, h("span", {class: "state " + st.state}, st.state)),
        h("td", {class: "progress"}, `${st.progress.admitted} / ${st.progress.parallelism}`),
        h("td", {class: "wrap"}, st.inputs.map((i) => i.kind === "exchange"
          ? `${i.name} ← ${i.upstream} (${i.distribution}, ${i.mode})` : `${i.name} (${i.kind} ${i.format || ""})`)
          .join("; ")),
        h("td", null, st.attempts_total), h("td", null, st.speculative_attempts),
        h("td", null, st.numEffectiveSpeculativeExecutions), h("td", null, (st.restarts_total ?? st.restarts.length)),
        h("td", null, st.blocked.filter((b) => !b.expired).map((b) => b.node).join(", ") || "-",
          st.expired ? h("span", {class: "tag badge-expired", title: "gc removed the committed results"},
                         "results expired") : null))));
  }

  function rerunSection(d) {
    const restarts = d.stages.flatMap((st) => st.restarts.map((r) => Object.assign({stage: st.stage}, r)));
    const events = d.stages.flatMap((st) => st.events.map((e) => Object.assign({stage: st.stage}, e)))
      .sort((a, b) => a.at - b.at);
    const box = h("div", {id: "reruns"});
    if (!restarts.length) {
      box.append(h("p", {class: "empty"}, "No attempt was rerun after a failure."));
    } else {
      box.append(h("table", {class: "restarts"},
        h("tr", null, ["stage", "subtask", "attempt", "state", "target", "node", "cause"].map((c) => h("th", null, c))),
        restarts.map((r) => h("tr", null, h("td", null, r.stage), h("td", null, r.subtask), h("td", null, r.attempt),
                              h("td", null, h("span", {class: "state " + r.state}, r.state)),
                              h("td", null, r.target || "-"), h("td", null, r.node || "-"),
                              h("td", {class: "wrap"}, r.cause || "-")))));
    }
    box.append(h("h2", null, "Controller events"), eventsTable(events, true));
    return box;
  }

  /* ---------------------------------------------------------------- rerun (FLIP-1 region) */

  /* "0, 3 5" -> [0, 3, 5]; "" -> null (all subtasks); anything else -> undefined. */
  function parseSubtasks(text) {
    const parts = text.split(/[\s,]+/).filter(Boolean);
    if (!parts.length) return null;
    if (!parts.every((p) => /^\d+$/.test(p))) return undefined;
    return parts.map(Number);
  }

  function regionList(result) {
    const items = [];
    for (const [stage, subs] of Object.entries(result.region)) {
      const named = (result.requested[stage] || []).length ? "named" : "downstream";
      items.push(h("li", {"data-stage": stage}, `stage ${stage}: subtasks ${subs.join(", ")} (${named})`));
    }
    for (const [stage, subs] of Object.entries(result.in_flight || {})) {
      items.push(h("li", null, `running consumer ${stage}: subtasks ${subs.join(", ")} restart with it`));
    }
    return h("ul", {id: "rerun-region"}, items);
  }

  async function postRerun(body) {
    const response = await fetch("../api/rerun?" + query({task_id: TASK_ID}), {
      method: "POST", credentials: "same-origin", cache: "no-store",
      headers: {"Content-Type": "application/json", Accept: "application/json"}, body: JSON.stringify(body)});
    const data = await response.json().catch(() => ({}));
    if (response.ok) return data;
    const detail = typeof data.detail === "object" && data.detail ? data.detail.message : data.detail;
    const why = {401: "your session expired: reload the page to log in again",
                 403: "you may not rerun this DAG's tasks (it needs the right to clear its task instances)"};
    throw new Error(why[response.status] || (typeof detail === "string" ? detail : "error " + response.status));
  }

  function rerunPanel(d) {
    const panel = document.getElementById("rerun-panel");
    if (!panel || panel.dataset.ready) return;
    panel.dataset.ready = "true";
    panel.hidden = false;
    const subtasks = h("input", {id: "rerun-subtasks", type: "text", size: 24,
                                 placeholder: `all, or e.g. 0, 3 (0..${d.progress.parallelism - 1})`});
    const downstream = h("input", {id: "rerun-downstream", type: "checkbox", checked: true});
    const preview = h("button", {id: "rerun-preview", type: "button"}, "Preview rerun");
    const result = h("div", {id: "rerun-result"});
    panel.replaceChildren(h("h2", null, "Rerun"),
      h("p", {class: "sub"}, "Discards the committed results of the chosen subtasks (and of their consumers) and " +
        "clears their tasks, so the scheduler runs exactly that region again (FLIP-1)."),
      h("label", null, "subtasks ", subtasks), " ",
      h("label", null, downstream, " and the subtasks that consumed them"), " ", preview, result);
    preview.addEventListener("click", async () => {
      const chosen = parseSubtasks(subtasks.value);
      if (chosen === undefined) {
        result.replaceChildren(h("p", {class: "message", id: "rerun-error"},
                                 "Subtasks: whole numbers separated by commas, or empty for all."));
        return;
      }
      const body = {subtasks: chosen, downstream: downstream.checked};
      result.replaceChildren(h("p", {class: "sub"}, "computing the region…"));
      let region;
      try {
        region = await postRerun({...body, dry_run: true});
      } catch (err) {
        result.replaceChildren(h("p", {class: "message", id: "rerun-error"}, "Cannot rerun: " + err.message));
        return;
      }
      const confirm = h("button", {id: "rerun-confirm", type: "button", class: "danger"}, "Rerun these");
      const cancel = h("button", {id: "rerun-cancel", type: "button"}, "Cancel");
      result.replaceChildren(h("p", null, "This reruns:"), regionList(region), confirm, " ", cancel);
      cancel.addEventListener("click", () => result.replaceChildren());
      confirm.addEventListener("click", async () => {
        confirm.disabled = true;
        try {
          const done = await postRerun({...body, dry_run: false});
          result.replaceChildren(h("p", {class: "sub", id: "rerun-done"},
            `Rerun requested: cleared tasks ${done.cleared_tasks.join(", ") || "(none found in the run)"}; ` +
            "the scheduler runs them again. Reload this page to follow the new attempts."));
        } catch (err) {
          result.replaceChildren(h("p", {class: "message", id: "rerun-error"}, "Rerun failed: " + err.message));
        }
      });
    });
  }

  /* ---------------------------------------------------------------- attempt log */

  function renderLog(d) {
    const frag = document.createDocumentFragment();
    document.title = `Log: ${d.stage} subtask ${d.subtask} attempt ${d.attempt}`;
    frag.append(
      h("h1", null, `Stage ${d.stage} · subtask ${d.subtask} · attempt ${d.attempt}`),
      h("div", {class: "sub"}, `DAG ${d.dag_id} · run ${d.run_id} · `,
        h("a", {href: "stage?" + query({task_id: TASK_ID}), id: "stage-link"}, "back to the stage")),
      h("p", {class: "sub", id: "log-path"}, "store: " + d.path + (d.truncated
        ? ` (showing the last ${d.size - d.start} of ${d.size} bytes)` : ` (${d.size} bytes)`)));
    // The note (a running attempt's log on S3: where it is meanwhile) is text, as everything h() appends.
    if (d.note) frag.append(h("p", {class: "message", id: "log-note"}, d.note));
    if (!d.exists) {
      if (!d.note) frag.append(h("p", {class: "message", id: "log-missing"}, "The attempt has written no log yet."));
    } else frag.append(h("p", {class: "sub"}, h("a", {id: "log-download", href: "../api/log/download?" + query(
      {task_id: TASK_ID, subtask: d.subtask, attempt: d.attempt})}, `download the whole log (${d.size} bytes)`)));
    // textContent only: the log is whatever the application printed.
    frag.append(h("pre", {id: "log-text", class: "log"}, d.text));
    return frag;
  }

  const page = document.body.dataset.page;
  if (!DAG_ID || !RUN_ID || (page !== "run" && !TASK_ID)) {
    document.getElementById("content").replaceChildren(
      h("p", {class: "message"}, "Open this view from a DAG run or a task instance in the Airflow UI."));
    setLive("error", "missing dag_id / run_id" + (page !== "run" ? " / task_id" : ""));
    return;
  }
  if (page === "log") {
    const which = {task_id: TASK_ID, subtask: params.get("subtask") || "0"};
    if (params.get("attempt")) which.attempt = params.get("attempt");  // else the subtask's latest attempt
    poll("../api/log?" + query(which), renderLog);
  } else if (page === "stage") {
    refreshStage = poll(() => "../api/stage?" + query({task_id: TASK_ID, offset: subtaskPage.offset,
                                                       limit: subtaskPage.limit}), renderStage);
  }
  else poll("../api/run?" + query(), renderRun);
})();
