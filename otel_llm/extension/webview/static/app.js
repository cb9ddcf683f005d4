// otel-llm web view. No library, no build step. Every string that comes from the server (span names,
// attribute values, model names ...) is hostile: it only ever reaches the page as a Text node or an
// attribute value set with setAttribute; nothing is parsed as HTML. The CSP forbids inline script.
"use strict";

(function () {
  const SEGMENTS = ["preprocess", "queue", "prefill", "decode", "postprocess", "kv_transfer", "compute",
    "queue_and_prefill", "routing", "coordination", "decode_queue", "inference"];
  const SORTS = [["start", "start"], ["ttft", "TTFT"], ["e2e", "e2e"], ["queue", "queue"], ["tpot", "TPOT"],
    ["gateway_overhead", "gateway overhead"]];
  const WINDOWS = [["5m", "5 m"], ["15m", "15 m"], ["1h", "1 h"], ["start", "since start"]];
  const SINCE = [["", "any time"], ["300", "last 5 m"], ["900", "last 15 m"], ["3600", "last 1 h"], ["86400", "last 24 h"]];
  const PAGE_SIZE = 50;
  const SVGNS = "http://www.w3.org/2000/svg";

  let meta = {refresh_interval: 5, auth: false, store: true};
  let timer = null;
  let refreshing = false;

  // --- DOM helpers: text only ----------------------------------------------------------------
  function h(tag, attrs, ...children) {
    const el = document.createElement(tag);
    for (const [key, value] of Object.entries(attrs || {})) {
      if (value === null || value === undefined || value === false) continue;
      if (key === "text") el.textContent = String(value);
      else if (key === "onclick" || key === "onchange" || key === "onsubmit") el.addEventListener(key.slice(2), value);
      else el.setAttribute(key, String(value));
    }
    for (const child of children.flat()) {
      if (child === null || child === undefined || child === false) continue;
      el.appendChild(typeof child === "object" ? child : document.createTextNode(String(child)));
    }
    return el;
  }
  function s(tag, attrs) {
    const el = document.createElementNS(SVGNS, tag);
    for (const [key, value] of Object.entries(attrs || {})) {
      if (key === "text") el.textContent = String(value);
      else el.setAttribute(key, String(value));
    }
    return el;
  }
  function clear(el) { while (el.firstChild) el.removeChild(el.firstChild); return el; }
  function safeUrl(url) {  // links to trace backends come from the validated config; still only http(s)
    try { const u = new URL(url); return (u.protocol === "http:" || u.protocol === "https:") ? u.href : null; }
    catch (e) { return null; }
  }

  // --- formatting ------------------------------------------------------------------------------
  function secs(v) {
    if (v === null || v === undefined || typeof v !== "number" || !isFinite(v)) return "—";
    const a = Math.abs(v);
    if (a === 0) return "0";
    if (a < 0.001) return (v * 1e6).toFixed(0) + " µs";
    if (a < 1) return (v * 1000).toFixed(a < 0.01 ? 2 : 1) + " ms";
    if (a < 100) return v.toFixed(a < 10 ? 3 : 2) + " s";
    return v.toFixed(0) + " s";
  }
  function niceStep(raw) {  // 1, 2, 2.5 or 5 times a power of ten, at least raw
    if (!(raw > 0) || !isFinite(raw)) return 1;
    const p = Math.pow(10, Math.floor(Math.log10(raw)));
    for (const m of [1, 2, 2.5, 5, 10]) if (m * p >= raw * (1 - 1e-9)) return m * p;
    return 10 * p;
  }
  function tickLabel(v) {  // secs() without trailing zeros: "1 s", "1.5 s", "500 ms"
    return secs(v).replace(/\.(\d*?)0+(?= )/, (m, d) => (d ? "." + d : ""));
  }
  function pct(v) { return (typeof v === "number" && isFinite(v)) ? (v * 100).toFixed(2) + " %" : "—"; }
  function num(v, digits) {
    if (typeof v !== "number" || !isFinite(v)) return "—";
    return v.toFixed(digits === undefined ? 0 : digits);
  }
  function time(ns) {
    if (!ns) return "—";
    const d = new Date(Number(ns) / 1e6);
    return d.toISOString().replace("T", " ").replace("Z", "");
  }
  function promString(v) { return '"' + String(v).replace(/\\/g, "\\\\").replace(/"/g, '\\"').replace(/\n/g, "\\n") + '"'; }

  // --- data --------------------------------------------------------------------------------------
  async function api(path) {
    const response = await fetch(path, {credentials: "same-origin", headers: {Accept: "application/json"}});
    if (response.status === 401) { window.location.assign("/login"); throw new Error("not logged in"); }
    const body = await response.json();
    if (!response.ok) throw new Error(body && body.error ? body.error : "HTTP " + response.status);
    return body;
  }
  function showError(err) {
    const box = document.getElementById("error");
    if (!err) { box.hidden = true; clear(box); return; }
    box.hidden = false;
    box.textContent = String(err && err.message ? err.message : err);
  }
  const lastData = {};
  function unchanged(key, data) {  // a refresh that brings nothing new leaves the page (and its elements) alone
    const text = JSON.stringify(data);
    if (lastData[key] === text) return true;
    lastData[key] = text;
    return false;
  }
  function setLive(text) { document.getElementById("live").textContent = text; }

  // --- charts (inline SVG) ---------------------------------------------------------------------
  // One SVG per metric: a line per series through consecutive points; a value without a neighbour
  // (an interval with observations between two without) is a dot; an interval with none is a gap.
  // ``marks``: horizontal lines [{value, cls, label}] (the model's objective, the sampling threshold).
  function chart(title, key, t, lines, marks, unit) {
    const W = 320, H = 90, P = 4;
    const values = [];
    for (const line of lines) for (const v of line.values) if (typeof v === "number" && isFinite(v)) values.push(v);
    marks = (marks || []).filter((m) => typeof m.value === "number");
    for (const m of marks) values.push(m.value);
    let max = values.length ? Math.max(...values) : 1;
    if (max <= 0) max = 1;
    max *= 1.1;
    const t0 = t.length ? t[0] : 0, t1 = t.length ? t[t.length - 1] : 1;
    const x = (ti) => P + (t1 > t0 ? (ti - t0) / (t1 - t0) : 1) * (W - 2 * P);
    const y = (v) => H - P - (v / max) * (H - 2 * P);
    const svg = s("svg", {viewBox: `0 0 ${W} ${H}`, class: "chart", role: "img", "aria-label": title, "data-metric": key});
    svg.appendChild(s("rect", {x: 0, y: 0, width: W, height: H, class: "chart-bg"}));
    for (const line of lines) {
      const runs = [];
      let run = null;
      line.values.forEach((v, i) => {
        if (typeof v !== "number" || !isFinite(v) || typeof t[i] !== "number") { run = null; return; }
        if (!run) runs.push(run = []);
        run.push([x(t[i]), y(v)]);
      });
      const d = runs.filter((r) => r.length > 1)
        .map((r) => r.map(([px, py], i) => (i ? "L" : "M") + px.toFixed(1) + " " + py.toFixed(1)).join(" ")).join(" ");
      if (d) svg.appendChild(s("path", {d: d, class: "line " + line.cls, "data-series": line.label}));
      for (const r of runs) {
        if (r.length === 1) svg.appendChild(s("circle", {cx: r[0][0].toFixed(1), cy: r[0][1].toFixed(1), r: 2,
          class: "dot " + line.cls, "data-series": line.label}));
      }
    }
    for (const m of marks) {
      svg.appendChild(s("line", {x1: P, x2: W - P, y1: y(m.value), y2: y(m.value), class: m.cls}));
      svg.appendChild(s("text", {x: W - P - 2, y: Math.max(10, y(m.value) - 3), class: "mark-label", "text-anchor": "end",
        text: m.label + " " + (unit === "s" ? secs(m.value) : m.value)}));
    }
    svg.appendChild(s("text", {x: P + 2, y: 11, class: "chart-max", text: unit === "s" ? secs(max) : num(max, 2) + (unit || "")}));
    const legend = h("div", {class: "legend"}, h("b", {text: title}), " ",
      lines.map((l) => h("span", {class: "key " + l.cls, text: l.label})));
    return h("figure", {class: "chart-box"}, legend, svg);
  }

  // --- pages -----------------------------------------------------------------------------------
  const main = () => document.getElementById("main");
  const params = () => new URLSearchParams(window.location.search);
  function setParams(p) {
    const q = p.toString();
    window.history.replaceState(null, "", window.location.pathname + (q ? "?" + q : ""));
  }

  // Overview ---------------------------------------------------------------------------------------
  function overviewSkeleton() {
    const root = clear(main());
    const win = params().get("window") || "5m";
    const bar = h("div", {class: "toolbar", id: "windows"}, h("span", {class: "muted", text: "window:"}));
    for (const [key, label] of WINDOWS) {
      bar.appendChild(h("button", {type: "button", class: key === win ? "active" : null, "data-window": key, text: label,
        onclick: () => { const p = params(); p.set("window", key); setParams(p); overviewSkeleton(); refresh(); }}));
    }
    root.appendChild(h("h1", {text: "Overview"}));
    root.appendChild(bar);
    root.appendChild(h("p", {class: "muted", id: "overview-note"}));
    root.appendChild(h("div", {id: "groups"}));
  }
  async function overviewData() {
    const win = params().get("window") || "5m";
    const data = await api("/api/ui/overview?window=" + encodeURIComponent(win));
    document.getElementById("overview-note").textContent =
      `Percentiles from the merged histogram buckets /metrics serves (Prometheus' histogram_quantile interpolation), ` +
      `over the last ${secs(data.window_seconds)}` + (data.window === "start" ? " (since start)" : "") +
      `; snapshots every ${secs(data.snapshot_interval)}, kept ${secs(data.history_seconds)}. ` +
      `The PromQL selects ${data.selector}, the label the shipped Prometheus config and Helm chart give otel-llm's ` +
      `series at scrape time: with vLLM's own /metrics scraped too, the same vllm: names would count each request twice. ` +
      `Objective: processors.llm_metrics.slo (what "SLO met" counts); kept above: the tail-sampling slo policy.`;
    const groups = clear(document.getElementById("groups"));
    if (!data.groups.length) groups.appendChild(h("p", {class: "empty", text: "No requests yet: point engines and gateways at the OTLP receivers."}));
    const byKey = {};
    for (const m of data.metrics) byKey[m.key] = m;
    for (const g of data.groups) {
      const card = h("section", {class: "card group", "data-model": g.model, "data-engine": g.engine});
      card.appendChild(h("h2", {}, h("span", {class: "model", text: g.model || "(no model)"}),
        g.engine ? " " : null, g.engine ? h("span", {class: "engine", text: g.engine}) : null));
      // The scrape's source label keeps the engines' own vllm: series (scraped too) out of the sums.
      const sel = `{${data.selector}, model_name=${promString(g.model)}, engine_kind=${promString(g.engine)}}`;
      const rng = data.window === "start" ? "5m" : data.window;
      card.appendChild(h("div", {class: "stats"},
        stat("requests", num(g.requests), "requests", g.requests),
        stat("rate", num(g.rate, 3) + " req/s", "rate", g.rate),
        stat("errors", pct(g.error_ratio), "error_ratio", g.error_ratio),
        stat("aborts", pct(g.abort_ratio), "abort_ratio", g.abort_ratio),
        ...accountingStats(g)));
      const accountingLine = accountingLines(g, rng, data.selector);
      if (accountingLine) card.appendChild(accountingLine);
      const acc = accounting(g, sel, rng);
      if (acc) card.appendChild(acc);
      for (const [service, reasons] of Object.entries(g.unmeasured || {})) card.appendChild(unmeasured(service, reasons));
      card.appendChild(h("p", {class: "promql"}, h("span", {class: "muted", text: "rate: "}),
        h("code", {text: `sum(rate(vllm:request_success_total${sel}[${rng}]))`}), " ",
        h("span", {class: "muted", text: "errors: "}),
        h("code", {text: `sum(rate(vllm:request_success_total{${data.selector}, model_name=${promString(g.model)}, finished_reason="error"}[${rng}]))`})));
      const table = h("table", {class: "metrics"});
      // objective: processors.llm_metrics.slo, what "SLO met" counts; kept above: the tail-sampling slo policy.
      table.appendChild(h("thead", {}, h("tr", {}, ["metric", "p50", "p95", "p99", "objective", "kept above", "count",
        "PromQL (vllm naming / gen_ai naming)"].map((c) => h("th", {text: c})))));
      const body = h("tbody");
      for (const key of Object.keys(g.metrics)) {
        const m = g.metrics[key], info = byKey[key] || {key: key, title: key};
        const objective = (g.objectives || {})[key], kept = g.slo ? g.slo[key] : undefined;
        const tr = h("tr", {"data-metric": key});
        tr.appendChild(h("th", {text: info.title}));
        for (const q of ["p50", "p95", "p99"]) {
          const over = typeof objective === "number" && typeof m[q] === "number" && m[q] > objective;
          tr.appendChild(h("td", {class: "num q" + (over ? " over" : ""), "data-quantile": q,
            "data-value": typeof m[q] === "number" ? String(m[q]) : "", text: secs(m[q])}));
        }
        tr.appendChild(h("td", {class: "num", "data-objective": typeof objective === "number" ? String(objective) : "",
          text: typeof objective === "number" ? secs(objective) : "—"}));
        tr.appendChild(h("td", {class: "num", "data-kept-above": typeof kept === "number" ? String(kept) : "",
          text: typeof kept === "number" ? secs(kept) : "—"}));
        tr.appendChild(h("td", {class: "num", text: num(m.count)}));
        const names = h("td", {class: "names"});
        const gsel = `{${data.selector}, gen_ai_request_model=${promString(g.model)}}`;
        names.appendChild(h("code", {text: `histogram_quantile(0.99, sum by (le) (rate(${info.vllm_name}_bucket${sel}[${rng}])))`}));
        if (info.gen_ai_name) {
          names.appendChild(h("br"));
          names.appendChild(h("code", {text: `histogram_quantile(0.99, sum by (le) (rate(${info.gen_ai_name}_bucket${gsel}[${rng}])))`}));
        }
        tr.appendChild(names);
        body.appendChild(tr);
      }
      table.appendChild(body);
      card.appendChild(table);
      const charts = h("div", {class: "charts"});
      charts.appendChild(chart("request rate", "rate", g.series.t, [{cls: "rate", label: "req/s", values: g.series.rate}], [], " req/s"));
      for (const key of Object.keys(g.metrics)) {
        const sr = g.series[key];
        if (!sr) continue;
        charts.appendChild(chart((byKey[key] || {}).title || key, key, g.series.t,
          [{cls: "p50", label: "p50", values: sr.p50}, {cls: "p95", label: "p95", values: sr.p95},
            {cls: "p99", label: "p99", values: sr.p99}],
          [{value: (g.objectives || {})[key], cls: "objective", label: "objective"},
            {value: g.slo ? g.slo[key] : undefined, cls: "slo", label: "keeps >"}], "s"));
      }
      card.appendChild(charts);
      groups.appendChild(card);
    }
    const elsewhere = Object.entries(data.unmeasured_elsewhere || {});
    if (elsewhere.length) {
      const card = h("section", {class: "card not-measured"});
      card.appendChild(h("h2", {text: "Not measured (no request counted)"}));
      for (const [service, reasons] of elsewhere) card.appendChild(unmeasured(service, reasons));
      groups.appendChild(card);
    }
  }
  // What otel-llm could not measure for a service (since start): spans refused, by reason, and
  // requests with an interval not measurable (two processes' clocks), by interval.
  function unmeasured(service, reasons) {
    const refused = [], partial = [];
    for (const [reason, count] of Object.entries(reasons)) {
      if (reason.startsWith("not_measurable_")) partial.push(`${reason.slice(15)} ${num(count)}`);
      else refused.push(`${reason} ${num(count)}`);
    }
    const total = Object.entries(reasons).filter(([r]) => !r.startsWith("not_measurable_")).reduce((a, [, c]) => a + c, 0);
    return h("p", {class: "unmeasured", "data-service": service, "data-refused": String(total)},
      h("span", {class: "muted", text: "service "}), h("code", {text: service || "(none)"}),
      h("span", {text: `: ${num(total)} spans refused` + (refused.length ? ` (${refused.join(", ")})` : "")}),
      partial.length ? h("span", {text: ` · not measurable: ${partial.join(", ")}`}) : null);
  }
  // SLO attainment and cost over the window (processors.llm_metrics.slo / .cost): null where not configured.
  function accountingStats(g) {
    const out = [];
    const slo = g.slo_attainment;
    if (slo) out.push(stat(`SLO met (${num(slo.met)} of ${num(slo.met + slo.missed)})`, pct(slo.ratio), "slo_attainment", slo.ratio));
    const cost = g.cost;
    for (const [currency, c] of Object.entries((cost && cost.currencies) || {})) {
      out.push(stat("cost " + currency, num(c.total, 6), "cost_" + currency, c.total));
    }
    if (cost && Object.keys(cost.unpriced_tokens || {}).length) {
      const unpriced = Object.values(cost.unpriced_tokens).reduce((a, b) => a + b, 0);
      out.push(stat("unpriced tokens", num(unpriced), "unpriced_tokens", unpriced));
    }
    return out;
  }
  function accountingLines(g, rng, selector) {
    const slo = g.slo_attainment, cost = g.cost;
    if (!slo && !cost) return null;
    const p = h("p", {class: "accounting"});
    if (slo) {
      p.appendChild(h("span", {class: "slo", "data-unmeasured": String(slo.unmeasured),
        text: `SLO: ${num(slo.met)} met, ${num(slo.missed)} missed, ${num(slo.unmeasured)} unmeasured `}));
      p.appendChild(h("code", {text: `llm:slo_attainment:ratio_rate5m{model_name=${promString(g.model)}}`}));
    }
    for (const [currency, c] of Object.entries((cost && cost.currencies) || {})) {
      const tenants = Object.entries(c.by_tenant).map(([t, v]) => `${t || "(no tenant)"} ${num(v, 6)}`).join(", ");
      p.appendChild(h("span", {class: "cost", "data-currency": currency, text: ` · cost by tenant (${currency}): ${tenants} `}));
      p.appendChild(h("code", {text: `sum by (tenant) (increase(otel_llm_request_cost_total{${selector}, model_name=${promString(g.model)}}[${rng}]))`}));
    }
    if (cost && Object.keys(cost.unpriced_tokens || {}).length) {
      const parts = Object.entries(cost.unpriced_tokens).map(([t, v]) => `${t} ${num(v)}`).join(", ");
      p.appendChild(h("span", {class: "unpriced", text: ` · unpriced tokens (no price configured): ${parts}`}));
    }
    return p;
  }
  // Prefix cache, speculative decoding and LoRA adapters over the window: only what spans reported.
  function accounting(g, sel, rng) {
    const a = g.accounting || {};
    if (!a.prompt_cache && !a.spec_decode && !a.adapters && !a.adapter_of) return null;
    const box = h("div", {class: "accounting"});
    const stats = h("div", {class: "stats"});
    const notes = h("p", {class: "promql"});
    if (a.prompt_cache) {
      const c = a.prompt_cache;
      stats.appendChild(stat("prefix cache hit (tokens)", pct(c.hit_ratio), "cache_hit_ratio", c.hit_ratio));
      stats.appendChild(stat("mean per request", pct(c.mean_request_hit_ratio), "cache_mean_request_hit_ratio", c.mean_request_hit_ratio));
      stats.appendChild(stat("cached / computed tokens", num(c.cached_tokens) + " / " + num(c.computed_tokens), "cached_tokens", c.cached_tokens));
      if (typeof c.cache_write_tokens === "number") stats.appendChild(stat("cache-write tokens", num(c.cache_write_tokens), "cache_write_tokens", c.cache_write_tokens));
      notes.appendChild(h("span", {class: "muted", text: "cache hit: "}));
      notes.appendChild(h("code", {text: `sum(rate(otel_llm_prompt_tokens_cached_total${sel}[${rng}])) / (sum(rate(otel_llm_prompt_tokens_cached_total${sel}[${rng}])) + sum(rate(otel_llm_prompt_tokens_computed_total${sel}[${rng}])))`}));
      notes.appendChild(document.createTextNode(" "));
    }
    if (a.spec_decode) {
      const d = a.spec_decode;
      stats.appendChild(stat("acceptance length, pooled", num(d.pooled_acceptance_length, 2), "spec_pooled_acceptance_length", d.pooled_acceptance_length));
      stats.appendChild(stat("acceptance length, per-request mean", num(d.mean_request_acceptance_length, 2), "spec_mean_request_acceptance_length", d.mean_request_acceptance_length));
      notes.appendChild(h("span", {class: "muted", text: "pooled = 1 + accepted / steps: "}));
      notes.appendChild(h("code", {text: `1 + sum(rate(vllm:spec_decode_num_accepted_tokens_total${sel}[${rng}])) / sum(rate(vllm:spec_decode_num_drafts_total${sel}[${rng}]))`}));
    }
    for (const [name, requests] of Object.entries(a.adapters || {})) {
      stats.appendChild(stat("LoRA " + name, num(requests) + " req", "adapter_requests", requests));
    }
    if (a.adapter_of) stats.appendChild(stat("LoRA adapter of", a.adapter_of, "adapter_of", undefined));
    box.appendChild(stats);
    if (notes.childNodes.length) box.appendChild(notes);
    return box;
  }
  function stat(label, text, key, value) {
    return h("div", {class: "stat", "data-stat": key, "data-value": typeof value === "number" ? String(value) : ""},
      h("div", {class: "stat-value", text: text}), h("div", {class: "stat-label", text: label}));
  }

  // Requests --------------------------------------------------------------------------------------
  function requestsSkeleton() {
    const root = clear(main());
    const p = params();
    root.appendChild(h("h1", {text: "Requests"}));
    const form = h("form", {class: "toolbar filters", id: "filters", onsubmit: (e) => e.preventDefault()});
    for (const name of ["model", "engine", "outcome", "policy"]) {
      const select = h("select", {name: name, id: "f-" + name, onchange: filterChanged},
        h("option", {value: "", text: "any " + name}));
      const current = p.get(name);
      if (current) select.appendChild(h("option", {value: current, text: current, selected: "selected"}));
      form.appendChild(h("label", {}, name + " ", select));
    }
    const since = h("select", {name: "since", id: "f-since", onchange: filterChanged},
      SINCE.map(([v, l]) => h("option", {value: v, text: l, selected: (p.get("since_s") || "") === v ? "selected" : null})));
    form.appendChild(h("label", {}, "time ", since));
    const sort = h("select", {name: "sort", id: "f-sort", onchange: filterChanged},
      SORTS.map(([v, l]) => h("option", {value: v, text: l, selected: (p.get("sort") || "start") === v ? "selected" : null})));
    form.appendChild(h("label", {}, "sort ", sort));
    const order = h("select", {name: "order", id: "f-order", onchange: filterChanged},
      [["desc", "largest / newest first"], ["asc", "smallest / oldest first"]].map(([v, l]) =>
        h("option", {value: v, text: l, selected: (p.get("order") || "desc") === v ? "selected" : null})));
    form.appendChild(h("label", {}, "order ", order));
    root.appendChild(form);
    const table = h("table", {class: "requests", id: "requests"});
    const head = h("tr");
    const cols = [["start", "start"], [null, "model"], [null, "engine"], [null, "outcome"], [null, "policy"],
      ["ttft", "TTFT"], ["tpot", "TPOT"], ["e2e", "e2e"], ["queue", "queue"], ["gateway_overhead", "overhead"],
      [null, "tokens in/out"], [null, "trace"]];
    for (const [key, label] of cols) {
      if (key) head.appendChild(h("th", {class: "sortable", "data-sort": key}, h("a", {href: "#", text: label,
        onclick: (e) => { e.preventDefault(); sortBy(key); }})));
      else head.appendChild(h("th", {text: label}));
    }
    table.appendChild(h("thead", {}, head));
    table.appendChild(h("tbody", {id: "rows"}));
    root.appendChild(table);
    root.appendChild(h("div", {class: "pager"},
      h("button", {type: "button", id: "prev", text: "← newer", onclick: () => page(-1)}),
      h("span", {id: "page-info", class: "muted"}),
      h("button", {type: "button", id: "next", text: "older →", onclick: () => page(1)})));
  }
  function filterChanged() {
    const p = params();
    for (const name of ["model", "engine", "outcome", "policy", "sort", "order"]) {
      const v = document.getElementById("f-" + name).value;
      if (v) p.set(name, v); else p.delete(name);
    }
    const since = document.getElementById("f-since").value;
    if (since) p.set("since_s", since); else p.delete("since_s");
    p.delete("offset");
    setParams(p);
    refresh();
  }
  function sortBy(key) {
    const p = params();
    if ((p.get("sort") || "start") === key) p.set("order", (p.get("order") || "desc") === "desc" ? "asc" : "desc");
    else { p.set("sort", key); p.set("order", "desc"); }
    p.delete("offset");
    setParams(p);
    document.getElementById("f-sort").value = p.get("sort");
    document.getElementById("f-order").value = p.get("order");
    refresh();
  }
  function page(direction) {
    const p = params();
    const offset = Math.max(0, Number(p.get("offset") || 0) + direction * PAGE_SIZE);
    if (offset) p.set("offset", String(offset)); else p.delete("offset");
    setParams(p);
    refresh();
  }
  let filtersLoaded = 0;
  async function loadFilters() {
    if (Date.now() - filtersLoaded < 15000) return;
    filtersLoaded = Date.now();
    const values = await api("/api/ui/filters");
    const p = params();
    for (const name of ["model", "engine", "outcome", "policy"]) {
      const select = document.getElementById("f-" + name);
      if (!select) continue;
      const current = p.get(name) || "";
      clear(select);
      select.appendChild(h("option", {value: "", text: "any " + name}));
      const options = new Set(values[name] || []);
      if (current) options.add(current);
      for (const v of options) select.appendChild(h("option", {value: v, text: v === "" ? "(empty)" : v, selected: v === current ? "selected" : null}));
      select.value = current;
    }
  }
  async function requestsData() {
    await loadFilters();
    const p = params();
    const q = new URLSearchParams();
    for (const name of ["model", "engine", "outcome", "policy", "sort", "order", "offset"]) if (p.get(name)) q.set(name, p.get(name));
    if (p.get("since_s")) q.set("since", String(BigInt(Date.now()) * 1000000n - BigInt(Number(p.get("since_s")) * 1e9)));
    q.set("limit", String(PAGE_SIZE));
    const data = await api("/api/ui/requests?" + q.toString());
    if (unchanged("requests", data)) return;
    const rows = clear(document.getElementById("rows"));
    for (const th of document.querySelectorAll("th.sortable")) {
      th.classList.toggle("sorted", th.getAttribute("data-sort") === data.sort);
      th.setAttribute("data-order", th.getAttribute("data-sort") === data.sort ? data.order : "");
    }
    if (!data.rows.length) rows.appendChild(h("tr", {}, h("td", {colspan: 12, class: "empty", text: "No kept requests match."})));
    for (const r of data.rows) {
      const href = "/ui/trace/" + encodeURIComponent(r.trace_id);
      rows.appendChild(h("tr", {class: "row outcome-" + (["stop", "length", "abort", "error", "unknown"].includes(r.outcome) ? r.outcome : "other"),
        "data-trace-id": r.trace_id},
      h("td", {class: "mono", text: time(r.start_time_unix_nano)}),
      h("td", {text: r.model || ""}), h("td", {text: r.engine_kind || ""}),
      h("td", {class: "outcome", text: r.outcome || ""}), h("td", {text: r.policy || ""}),
      h("td", {class: "num", "data-col": "ttft", "data-value": r.ttft_s ?? "", text: secs(r.ttft_s)}),
      h("td", {class: "num", "data-col": "tpot", "data-value": r.tpot_s ?? "", text: secs(r.tpot_s)}),
      h("td", {class: "num", "data-col": "e2e", "data-value": r.e2e_s ?? "", text: secs(r.e2e_s)}),
      h("td", {class: "num", "data-col": "queue", "data-value": r.queue_s ?? "", text: secs(r.queue_s)}),
      h("td", {class: "num", "data-col": "gateway_overhead", "data-value": r.gateway_overhead_s ?? "", text: secs(r.gateway_overhead_s)}),
      h("td", {class: "num", text: num(r.prompt_tokens) + " / " + num(r.completion_tokens)}),
      h("td", {class: "mono"}, h("a", {href: href, class: "trace-link", text: String(r.trace_id).slice(0, 12) + "…"}))));
    }
    const offset = data.offset;
    document.getElementById("page-info").textContent = data.rows.length ?
      `rows ${offset + 1}–${offset + data.rows.length}` : "";
    document.getElementById("prev").disabled = offset === 0;
    document.getElementById("next").disabled = !data.has_more;
  }

  // Trace -----------------------------------------------------------------------------------------
  let openSpan = null;
  function traceSkeleton(id) {
    const root = clear(main());
    root.appendChild(h("h1", {}, "Trace ", h("span", {class: "mono", id: "trace-id", text: id})));
    root.appendChild(h("div", {id: "trace-summary"}));
    root.appendChild(h("div", {id: "waterfall", class: "waterfall"}));
    root.appendChild(h("div", {id: "span-detail"}));
  }
  async function traceData(id) {
    const data = await api("/api/ui/trace/" + encodeURIComponent(id));
    if (unchanged("trace", data)) return;
    const sum = data.summary || {};
    const summary = clear(document.getElementById("trace-summary"));
    const dl = h("dl", {class: "summary card"});
    const add = (k, v) => { dl.appendChild(h("dt", {text: k})); dl.appendChild(h("dd", {"data-field": k, text: v})); };
    add("model", sum.model || "—"); add("model source", sum.model_source || "—"); add("engine", sum.engine_kind || "—");
    add("service", sum.service_name || "—"); add("outcome", sum.outcome || "—");
    add("sampling policy", sum.policy || (data.policies || []).join(", ") || "—");
    add("TTFT", secs(sum.ttft_s)); add("TPOT", secs(sum.tpot_s)); add("e2e", secs(sum.e2e_s)); add("queue", secs(sum.queue_s));
    add("gateway overhead", secs(sum.gateway_overhead_s)); add("tokens in/out", num(sum.prompt_tokens) + " / " + num(sum.completion_tokens));
    summary.appendChild(dl);
    const links = h("p", {class: "links"});
    for (const link of data.links || []) {
      const url = safeUrl(link.url);
      if (url) links.appendChild(h("a", {href: url, target: "_blank", rel: "noopener noreferrer", class: "button", text: "Open in " + link.name}));
    }
    if ((data.links || []).length) summary.appendChild(links);
    const legend = h("p", {class: "legend"}, SEGMENTS.filter((seg) => data.spans.some((sp) => sp.segment === seg))
      .map((seg) => h("span", {class: "key seg-" + seg, text: seg})));
    summary.appendChild(legend);

    const t0 = Number(data.start_unix_nano), t1 = Number(data.end_unix_nano);
    const total = Math.max(1, t1 - t0);
    const wf = clear(document.getElementById("waterfall"));
    const axis = h("div", {class: "wf-row wf-axis"}, h("div", {class: "wf-name", text: "span"}));
    const ticks = h("div", {class: "wf-track"});
    const step = niceStep(total / 1e9 / 5);  // three to six ticks at round values
    for (let i = 0; i * step <= total / 1e9 * (1 + 1e-9); i++) {
      const at = i * step * 1e9 / total;
      const tick = h("span", {class: "tick", text: tickLabel(i * step)});
      tick.style.left = (at * 100) + "%";
      ticks.appendChild(tick);
    }
    axis.appendChild(ticks);
    wf.appendChild(axis);
    for (const sp of data.spans) {
      const start = Number(sp.start_time_unix_nano), end = Number(sp.end_time_unix_nano);
      const dur = Math.max(0, end - start);
      const seg = SEGMENTS.includes(sp.segment) ? "seg-" + sp.segment : (sp.segment ? "seg-other" : "kind-" + (Number(sp.kind) || 0));
      const bar = h("div", {class: "bar " + seg + (sp.status_code === 2 ? " status-error" : ""), "data-duration-ns": String(dur), title: secs(dur / 1e9)});
      bar.style.left = ((start - t0) / total * 100) + "%";
      bar.style.width = (dur / total * 100) + "%";
      const label = h("span", {class: "bar-label", text: secs(dur / 1e9)});
      label.style.left = Math.min(100, (end - t0) / total * 100) + "%";
      const name = h("div", {class: "wf-name", title: sp.name || ""},
        h("span", {class: "svc", text: sp.service_name || ""}), " ", h("span", {class: "span-name", text: sp.name || "(unnamed)"}));
      name.style.paddingLeft = (0.3 + 1.1 * Math.min(Number(sp.depth) || 0, 20)) + "em";
      const row = h("div", {class: "wf-row span-row", "data-span-id": sp.span_id, tabindex: 0,
        onclick: () => { openSpan = sp.span_id; detail(sp); }}, name, h("div", {class: "wf-track"}, bar, label));
      wf.appendChild(row);
    }
    const open = data.spans.find((sp) => sp.span_id === openSpan) || data.spans.find((sp) => sp.span_id === sum.span_id) || data.spans[0];
    if (open) detail(open);
  }
  function detail(sp) {
    const box = clear(document.getElementById("span-detail"));
    const card = h("section", {class: "card"});
    card.appendChild(h("h2", {}, "Span ", h("span", {class: "span-name", text: sp.name || "(unnamed)"})));
    const table = h("table", {class: "attrs"});
    const row = (k, v) => table.appendChild(h("tr", {}, h("th", {text: k}), h("td", {class: "attr-value", text: v})));
    row("span id", sp.span_id); row("parent", sp.parent_span_id || "—"); row("service", sp.service_name || "");
    row("kind", ["unspecified", "internal", "server", "client", "producer", "consumer"][Number(sp.kind)] || String(sp.kind));
    row("duration", secs((Number(sp.end_time_unix_nano) - Number(sp.start_time_unix_nano)) / 1e9));
    row("status", (["unset", "ok", "error"][Number(sp.status_code)] || String(sp.status_code)) + (sp.status_message ? ": " + sp.status_message : ""));
    const attrs = sp.attributes || {};
    for (const key of Object.keys(attrs).sort()) {
      const v = attrs[key];
      row(key, typeof v === "string" ? v : JSON.stringify(v));
    }
    card.appendChild(table);
    box.appendChild(card);
  }

  // Status ----------------------------------------------------------------------------------------
  function statusSkeleton() {
    const root = clear(main());
    root.appendChild(h("h1", {text: "Status"}));
    root.appendChild(h("div", {id: "status"}));
  }
  async function statusData() {
    const data = await api("/api/ui/status");
    const root = clear(document.getElementById("status"));
    if (data.exposed_without_token && data.exposed_without_token.length) {
      const warn = h("section", {class: "card exposed", id: "exposed"}, h("h2", {text: "Listening beyond loopback without a token"}));
      const ul = h("ul", {});
      for (const line of data.exposed_without_token) ul.appendChild(h("li", {text: line}));
      warn.appendChild(ul);
      root.appendChild(warn);
    }
    const comp = h("section", {class: "card"}, h("h2", {text: "Components"}));
    const ct = h("table", {class: "components"}, h("tr", {}, ["kind", "name", "", "state"].map((c) => h("th", {text: c}))));
    for (const c of data.components) ct.appendChild(h("tr", {class: c.running ? "ok" : "down"},
      h("td", {text: c.kind}), h("td", {text: c.name}), h("td", {text: c.detail}), h("td", {class: "state", text: c.running ? "running" : "stopped"})));
    comp.appendChild(ct);
    root.appendChild(comp);
    if (data.store) {
      const st = data.store;
      const card = h("section", {class: "card", id: "store"}, h("h2", {text: "Trace store"}));
      const dl = h("dl", {class: "summary"});
      const add = (k, v) => { dl.appendChild(h("dt", {text: k})); dl.appendChild(h("dd", {text: v})); };
      if (st.error) add("error", st.error);
      add("path", st.path || ""); add("traces", num(st.traces)); add("requests", num(st.requests));
      add("size", num((st.size_bytes || 0) / 1048576, 1) + " MiB of " + num((st.max_size_bytes || 0) / 1048576, 0) + " MiB");
      add("retention", secs(st.retention_seconds)); add("oldest", st.oldest_stored_at ? new Date(st.oldest_stored_at * 1000).toISOString() : "—");
      card.appendChild(dl);
      root.appendChild(card);
    }
    const sections = {};
    for (const f of data.telemetry) (sections[f.section] = sections[f.section] || []).push(f);
    const titles = {intake: "Intake: accepted, refused, malformed", sampling: "Tail sampling: traces in memory, decisions",
      exporters: "Exporters: queues, failures", store: "Store", other: "Other"};
    for (const key of ["intake", "sampling", "exporters", "store", "other"]) {
      if (!sections[key]) continue;
      const card = h("section", {class: "card telemetry", "data-section": key}, h("h2", {text: titles[key]}));
      const table = h("table", {class: "telemetry-table"}, h("tr", {}, ["metric", "labels", "value"].map((c) => h("th", {text: c}))));
      for (const f of sections[key]) {
        const samples = f.samples.length ? f.samples : [{name: f.name, labels: {}, value: 0}];
        samples.forEach((sm, i) => {
          const labels = Object.entries(sm.labels).map(([k, v]) => k + "=" + v).join(", ");
          const lossy = /refus|reject|malformed|drop|fail|lost|overflow|evict/.test(f.name) && Number(sm.value) > 0;
          table.appendChild(h("tr", {class: lossy ? "lossy" : null, "data-sample": sm.name},
            h("td", {title: f.help || ""}, i === 0 ? h("code", {text: sm.name}) : h("code", {class: "muted", text: sm.name})),
            h("td", {class: "labels", text: labels}), h("td", {class: "num", text: typeof sm.value === "number" ? num(sm.value, Number.isInteger(sm.value) ? 0 : 3) : String(sm.value)})));
        });
      }
      card.appendChild(table);
      root.appendChild(card);
    }
    root.appendChild(h("section", {class: "card"}, h("h2", {text: "Effective config (secrets masked)"}),
      h("pre", {id: "config", text: JSON.stringify(data.config, null, 2)})));
  }

  // --- router and live refresh -----------------------------------------------------------------
  function route() {
    const path = window.location.pathname;
    const trace = path.match(/^\/ui\/trace\/([0-9a-fA-F]{1,32})$/);
    if (trace) return {page: "trace", id: trace[1]};
    if (path === "/ui/requests") return {page: "requests"};
    if (path === "/ui/status") return {page: "status"};
    return {page: "overview"};
  }
  const TITLES = {overview: "Overview", requests: "Requests", trace: "Trace", status: "Status"};
  async function refresh() {
    if (refreshing) return;
    refreshing = true;
    const r = route();
    try {
      if (r.page === "overview") await overviewData();
      else if (r.page === "requests") await requestsData();
      else if (r.page === "trace") await traceData(r.id);
      else await statusData();
      showError(null);
      setLive("updated " + new Date().toLocaleTimeString());
      document.body.setAttribute("data-loaded", String(Number(document.body.getAttribute("data-loaded") || 0) + 1));
    } catch (err) {
      showError(err);
      setLive("update failed");
    } finally {
      refreshing = false;
    }
  }
  async function init() {
    const r = route();
    document.title = "otel-llm · " + TITLES[r.page];
    for (const a of document.querySelectorAll("nav a")) a.classList.toggle("active", a.getAttribute("data-page") === (r.page === "trace" ? "requests" : r.page));
    try { meta = await api("/api/ui/meta"); } catch (err) { showError(err); return; }
    document.getElementById("logout").hidden = !meta.auth;
    if (r.page === "overview") overviewSkeleton();
    else if (r.page === "requests") requestsSkeleton();
    else if (r.page === "trace") traceSkeleton(r.id);
    else statusSkeleton();
    await refresh();
    timer = window.setInterval(refresh, Math.max(500, meta.refresh_interval * 1000));
  }
  document.addEventListener("DOMContentLoaded", init);
})();
