// The rollout viewer's page: a manifest inline, data chunks loaded on first
// use (inline JSON elements, or <script> files beside the page: a page
// opened from disk may load scripts but not fetch files). Plain DOM, no
// framework: it opens offline.
"use strict";

const M = JSON.parse(document.getElementById("manifest").textContent);
const PER_PAGE = 50;
const chunks = {};
const waiting = {};

// Chunk files call this when they load.
window.VIEWER_CHUNK = function (name, value) {
  chunks[name] = value;
  if (waiting[name]) waiting[name].resolve(value);
};

function load(name) {
  if (name in chunks) return Promise.resolve(chunks[name]);
  if (waiting[name]) return waiting[name].promise;
  const w = {};
  w.promise = new Promise((resolve, reject) => {
    w.resolve = resolve;
    w.reject = reject;
  });
  waiting[name] = w;
  const el = document.getElementById("chunk-" + name);
  if (el) {
    setTimeout(() => {
      try {
        chunks[name] = JSON.parse(el.textContent);
        el.textContent = "";  // Parsed once; the text is not needed again.
        w.resolve(chunks[name]);
      } catch (e) {
        w.reject(e);
      }
    }, 0);
  } else {
    const s = document.createElement("script");
    s.src = M.data_dir + "/" + name + ".js";
    s.onerror = () => w.reject(new Error("cannot load " + s.src +
                                         " (keep it beside the page)"));
    document.head.appendChild(s);
  }
  return w.promise;
}

// ------------------------------------------------------------- helpers.

function h(tag, attrs, ...kids) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k === "class") el.className = v;
    else if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else el.setAttribute(k, v === true ? "" : v);
  }
  for (const kid of kids.flat()) {
    if (kid === null || kid === undefined || kid === false) continue;
    el.appendChild(kid instanceof Node ? kid : document.createTextNode(kid));
  }
  return el;
}

function fmt(x, digits) {
  if (x === null || x === undefined) return "–";
  if (typeof x !== "number") return String(x);
  return Number.isInteger(x) && digits === undefined ? String(x)
      : x.toFixed(digits === undefined ? 3 : digits);
}

function badge(text, cls, title) {
  return h("span", {class: "badge " + (cls || ""), title: title || null}, text);
}

// Shading: a token's background darkens as its sampled log-prob falls;
// p >= 0.9 stays clear, log-prob -6 (p 0.0025) and below is darkest.
function shade(lp) {
  if (lp === null || lp === undefined) return "transparent";
  const a = Math.max(0, Math.min(1, (-lp - 0.1) / 5.9));
  return a < 0.02 ? "transparent" : `rgba(214,39,40,${(0.08 + 0.72 * a).toFixed(3)})`;
}

function groupOf(row) { return M.groups[row.g]; }

// ------------------------------------------------------------- header.

function statsTable(groups) {
  const judged = groups.some(g => g.stats.steps !== undefined);
  const cols = ["n", "reward", "accuracy", "void_rate", "tool_error_rate",
                "turns", "tokens", "min_logp"].concat(judged ? ["good_rate"] : []);
  const head = h("tr", {}, h("th", {}, "group"), cols.map(c => h("th", {}, c)));
  const body = groups.map(g => h("tr", {}, h("td", {}, g.name),
      cols.map(c => h("td", {}, fmt(g.stats[c], c === "n" ? undefined : 3)))));
  return h("table", {class: "stats"}, h("thead", {}, head), h("tbody", {}, body));
}

// Reward and void rate per training iteration, a line per place.
function curve() {
  const series = {};
  for (const g of M.groups) {
    if (g.kind !== "train") continue;
    const key = M.runs[g.run].label + (g.where !== "." ? "/" + g.where : "");
    (series[key] = series[key] || []).push(g);
  }
  const keys = Object.keys(series);
  if (!keys.length) return null;
  const W = 360, H = 150, L = 30, B = 20;
  const maxIt = Math.max(1, ...M.groups.filter(g => g.kind === "train").map(g => g.iteration));
  const x = it => L + (W - L - 8) * it / maxIt;
  const y = v => 8 + (H - B - 8) * (1 - v);
  const svg = document.createElementNS("http://www.w3.org/2000/svg", "svg");
  svg.setAttribute("width", W); svg.setAttribute("height", H);
  svg.setAttribute("class", "curve");
  const add = (tag, attrs, text) => {
    const el = document.createElementNS("http://www.w3.org/2000/svg", tag);
    for (const [k, v] of Object.entries(attrs)) el.setAttribute(k, v);
    if (text) el.textContent = text;
    svg.appendChild(el);
  };
  for (const v of [0, 0.5, 1]) {
    add("line", {x1: L, x2: W - 8, y1: y(v), y2: y(v), stroke: "#eee"});
    add("text", {x: 4, y: y(v) + 3}, String(v));
  }
  add("text", {x: L, y: H - 5}, "iteration 0");
  add("text", {x: W - 60, y: H - 5}, "iteration " + maxIt);
  const colors = ["#1f77b4", "#2ca02c", "#9467bd", "#8c564b", "#17becf"];
  keys.forEach((k, i) => {
    const gs = series[k];
    for (const [stat, dash] of [["reward", ""], ["void_rate", "4 3"]]) {
      const pts = gs.filter(g => g.stats[stat] !== null)
          .map(g => `${x(g.iteration).toFixed(1)},${y(g.stats[stat]).toFixed(1)}`);
      if (pts.length) add("polyline", {points: pts.join(" "), fill: "none",
          stroke: colors[i % colors.length], "stroke-width": 1.5, "stroke-dasharray": dash});
    }
  });
  const fig = h("figure", {style: "margin:8px 0"});
  fig.appendChild(svg);
  fig.appendChild(h("figcaption", {class: "sub"},
      "mean reward (solid) and void rate (dashed) per iteration: " + keys.join(", ")));
  return fig;
}

function header() {
  const top = document.getElementById("top");
  const runs = M.runs.map(r => r.label + " (" + r.workdir + ")").join(" · ");
  top.appendChild(h("h1", {}, "Rollouts: " + M.title));
  const notes = M.runs.filter(r => !r.vocab).map(r =>
      `${r.label}: no tokenizer found, turns shown as text with a log-prob strip`).concat(
      M.runs.filter(r => r.left_out).map(r => `${r.label}: ${r.left_out} training iterations ` +
          "left out (evenly spaced; the view job's page holds them all)"));
  top.appendChild(h("div", {class: "sub"}, `built ${M.built} · ${runs}` +
      (notes.length ? " · " + notes.join("; ") : "")));
  if (M.problems.length) {
    top.appendChild(h("div", {class: "problems", id: "problems"},
        "Not shown, as read from disk:\n" + M.problems.join("\n")));
  }
  const many = M.groups.length > 14;
  const shown = many ? M.groups.slice(0, 6).concat(M.groups.slice(-6)) : M.groups;
  const table = h("div", {}, statsTable(shown),
      many ? h("div", {class: "sub"}, `${M.groups.length - 12} groups not listed (all are in the group filter)`) : null);
  top.appendChild(h("div", {class: "overview"}, table, curve()));
}

// ------------------------------------------------------------- the list.

const S = {groups: new Set(), page: 0, rows: [], shown: [], open: new Set(),
           text: {}, textLoading: false};

function defaultGroups() {
  const total = M.groups.reduce((a, g) => a + g.stats.n, 0);
  if (total <= 20000) return M.groups.map((g, i) => i);
  const train = M.groups.map((g, i) => i).filter(i => M.groups[i].kind === "train");
  return [train.length ? train[train.length - 1] : 0];
}

function controls() {
  const box = document.getElementById("controls");
  const sel = h("select", {id: "f-groups", multiple: true,
                           size: Math.min(6, M.groups.length)});
  M.groups.forEach((g, i) => sel.appendChild(
      h("option", {value: i, selected: S.groups.has(i)}, `${g.name} (${g.stats.n})`)));
  sel.addEventListener("change", () => {
    S.groups = new Set([...sel.selectedOptions].map(o => +o.value));
    refreshRows();
  });
  const choice = (id, label, options) => h("label", {}, label,
      h("select", {id, onchange: () => { S.page = 0; render(); }},
        options.map(([v, t]) => h("option", {value: v}, t))));
  const num = (id, label, step) => h("label", {}, label,
      h("input", {id, type: "number", step, oninput: () => { S.page = 0; render(); }}));
  const strategies = [...new Set(M.groups.flatMap(g => g.strategies))];
  const judged = M.groups.some(g => g.stats.steps !== undefined);
  box.append(...[
      h("label", {}, "groups (iterations, policies)", sel),
      choice("f-outcome", "answer", [["", "any"], ["1", "right"], ["0", "wrong"], ["null", "not checked"]]),
      choice("f-reward", "reward", [["", "any"], ["pos", "> 0"], ["zero", "≤ 0"]]),
      choice("f-void", "void", [["", "any"], ["1", "void"], ["0", "not void"]]),
      choice("f-error", "tool error", [["", "any"], ["1", "with"], ["0", "without"]]),
      num("f-turns-min", "turns ≥", 1), num("f-turns-max", "turns ≤", 1),
      num("f-minlp", "lowest token log-prob ≤", 0.5),
      judged ? choice("f-judge", "judge", [["", "any"], ["B", "a BAD step"],
          ["G", "every step GOOD"], ["?", "a step not judged"]]) : null,
      strategies.length ? choice("f-kept", "filters", [["", "any"]].concat(
          strategies.flatMap(s => [["k:" + s, "kept by " + s], ["d:" + s, "dropped by " + s]]))) : null,
      h("label", {}, "search (id, question, answer, reference)",
        h("input", {id: "f-search", type: "search", placeholder: "text",
                    oninput: () => { S.page = 0; render(); }})),
      h("label", {class: "check", title: "also search every turn's text: loads the detail chunks of the trajectories the other filters keep"},
        h("input", {id: "f-full", type: "checkbox", onchange: () => { S.page = 0; render(); }}), "full text"),
      choice("f-sort", "sort by", [["id", "id"], ["r", "reward"], ["nt", "turns"],
          ["nk", "tokens"], ["ml", "lowest token log-prob"], ["te", "tool errors"]].concat(
          judged ? [["pg", "lowest P(GOOD)"]] : [])),
      choice("f-dir", "order", [["1", "ascending"], ["-1", "descending"]]),
      legend()].filter(Boolean));
}

function legend() {
  return h("div", {class: "legend"}, "token log-prob:",
      [-0.1, -1, -2, -4, -6].map(lp => h("span", {},
          h("span", {class: "sw", style: `background:${shade(lp)};border:1px solid #ddd`}), " " + lp)),
      h("span", {class: "obs", style: "margin:0 0 0 8px;padding:0 6px"}, "tool output: not in the loss"));
}

function value(id) {
  const el = document.getElementById(id);
  return el ? el.value : "";
}

function refreshRows() {
  const ids = [...S.groups].sort((a, b) => a - b);
  const status = document.getElementById("status");
  status.textContent = "loading " + ids.length + " group(s)…";
  Promise.all(ids.map(i => load(M.groups[i].summary))).then(lists => {
    S.rows = [];
    lists.forEach((rows, n) => rows.forEach(r => { r.g = ids[n]; S.rows.push(r); }));
    S.page = 0;
    openFromHash();
    render();
  }).catch(err => { status.textContent = "error: " + err.message; });
}

// A link to `rollouts.html#id=<trajectory id>` opens that trajectory (in every
// loaded group that has it), with the search set to its id.
function openFromHash() {
  const m = /^#id=(.+)$/.exec(location.hash);
  if (!m || S.hashDone) return;
  S.hashDone = true;
  const id = decodeURIComponent(m[1]);
  const hits = S.rows.filter(r => r.id === id);
  if (!hits.length) return;
  document.getElementById("f-search").value = id;
  hits.forEach(r => S.open.add(r.g + ":" + r.c + ":" + r.k));
}

function passes(r, f) {
  if (f.outcome !== "" && String(r.o) !== f.outcome) return false;
  if (f.reward === "pos" && !(r.r > 0)) return false;
  if (f.reward === "zero" && !(r.r !== null && r.r <= 0)) return false;
  if (f.void !== "" && String(r.v) !== f.void) return false;
  if (f.error === "1" && !(r.te > 0)) return false;
  if (f.error === "0" && r.te > 0) return false;
  if (f.tmin !== "" && r.nt < +f.tmin) return false;
  if (f.tmax !== "" && r.nt > +f.tmax) return false;
  if (f.minlp !== "" && !(r.ml !== null && r.ml <= +f.minlp)) return false;
  if (f.judge === "G") {
    if (!(r.j && /^G+$/.test(r.j))) return false;
  } else if (f.judge && !(r.j || "").includes(f.judge)) {
    return false;
  }
  if (f.kept) {
    const [k, s] = [f.kept[0], f.kept.slice(2)];
    const n = (r.kept || {})[s] || 0;
    if (k === "k" ? n === 0 : n > 0) return false;
  }
  return true;
}

function matches(r, q, full) {
  const hay = [r.id, r.q, r.ans, r.ref, r.vw, r.src].join("\n").toLowerCase();
  if (hay.includes(q)) return true;
  if (!full) return false;
  const text = S.text[r.g + ":" + r.c + ":" + r.k];
  return text !== undefined && text.includes(q);
}

function filters() {
  return {outcome: value("f-outcome"), reward: value("f-reward"), void: value("f-void"),
          error: value("f-error"), tmin: value("f-turns-min"), tmax: value("f-turns-max"),
          minlp: value("f-minlp"), judge: value("f-judge"), kept: value("f-kept")};
}

// Full-text search: the detail chunks of the rows the other filters keep,
// loaded once each, their texts kept lower-cased by row.
function loadTexts(rows) {
  const need = new Set();
  for (const r of rows) {
    if (S.text[r.g + ":" + r.c + ":" + r.k] === undefined) need.add(r.g + ":" + r.c);
  }
  if (!need.size || S.textLoading) return false;
  S.textLoading = true;
  document.getElementById("status").textContent = `loading ${need.size} chunk(s) for the full-text search…`;
  Promise.all([...need].map(key => {
    const [g, c] = key.split(":").map(Number);
    return load(M.groups[g].chunks[c]).then(d => d.items.forEach((it, k) => {
      S.text[g + ":" + c + ":" + k] = (d.prompts[it.p] + "\n" + it.turns.map(
          t => t.x + "\n" + t.obs + "\n" + ((t.step || {}).reply || "")).join("\n")).toLowerCase();
    }));
  })).then(() => { S.textLoading = false; render(); })
    .catch(err => { S.textLoading = false; document.getElementById("status").textContent = "error: " + err.message; });
  return true;
}

function render() {
  const f = filters();
  let rows = S.rows.filter(r => passes(r, f));
  const q = value("f-search").trim().toLowerCase();
  if (q) {
    const full = document.getElementById("f-full").checked;
    if (full && loadTexts(rows)) return;
    rows = rows.filter(r => matches(r, q, full));
  }
  const key = value("f-sort") || "id", dir = +(value("f-dir") || 1);
  const missing = dir > 0 ? Infinity : -Infinity;
  rows.sort((a, b) => {
    if (key === "id") return dir * (a.g - b.g || a.c - b.c || a.k - b.k);
    const x = a[key] === null || a[key] === undefined ? missing : a[key];
    const y = b[key] === null || b[key] === undefined ? missing : b[key];
    return dir * (x - y) || a.g - b.g || a.c - b.c || a.k - b.k;
  });
  S.shown = rows;
  const pages = Math.max(1, Math.ceil(rows.length / PER_PAGE));
  S.page = Math.min(S.page, pages - 1);
  document.getElementById("status").textContent =
      `${rows.length} of ${S.rows.length} trajectories shown (${S.groups.size} group(s) loaded)` +
      (rows.length > PER_PAGE ? `, page ${S.page + 1} of ${pages}` : "");
  const body = h("tbody");
  for (const r of rows.slice(S.page * PER_PAGE, (S.page + 1) * PER_PAGE)) {
    const rk = r.g + ":" + r.c + ":" + r.k;
    const tr = rowView(r);
    body.appendChild(tr);
    if (S.open.has(rk)) {
      tr.classList.add("open");
      body.appendChild(detailRow(r));
    }
    tr.addEventListener("click", () => {
      if (S.open.has(rk)) S.open.delete(rk); else S.open.add(rk);
      render();
    });
  }
  const judged = M.groups.some(g => g.stats.steps !== undefined);
  const head = h("tr", {}, ["group", "id", "reward", "flags", "turns", "tokens",
      "lowest log-prob"].concat(judged ? ["judge", "filters"] : [])
      .concat(["answer / reference", "question"]).map(c => h("th", {}, c)));
  const table = h("table", {class: "rows", id: "rows-table"}, h("thead", {}, head), body);
  const box = document.getElementById("rows");
  box.replaceChildren(table);
  pager(document.getElementById("pager"), pages, S.page, p => { S.page = p; render(); });
}

function pager(box, pages, page, go) {
  box.replaceChildren(
      h("button", {type: "button", disabled: page === 0, onclick: () => go(page - 1)}, "‹ previous"),
      h("span", {class: "muted"}, `page ${page + 1} of ${pages}`),
      h("button", {type: "button", disabled: page >= pages - 1, onclick: () => go(page + 1)}, "next ›"));
}

function answerCell(r) {
  const mark = r.o === 1 ? "right" : r.o === 0 ? "wrong" : "muted";
  return h("td", {}, h("span", {class: mark}, r.ans === null || r.ans === undefined ? "(no answer)" : r.ans),
      r.ref !== undefined ? h("span", {class: "muted"}, " / " + r.ref) : null);
}

function rowView(r) {
  const flags = [];
  if (r.v) flags.push(badge("VOID", "void", r.vw || "void"));
  if (r.te) flags.push(badge("tool error" + (r.te > 1 ? " ×" + r.te : ""), "err"));
  for (const e of r.end) if (e !== "void") flags.push(badge(e.replace("_", " ")));
  const judged = M.groups.some(g => g.stats.steps !== undefined);
  const cells = [h("td", {class: "muted"}, groupOf(r).name), h("td", {}, r.id),
      h("td", {class: "num"}, fmt(r.r, 2)), h("td", {}, flags),
      h("td", {class: "num"}, fmt(r.nt)), h("td", {class: "num"}, fmt(r.nk)),
      h("td", {class: "num"}, fmt(r.ml, 2))];
  if (judged) {
    cells.push(h("td", {}, (r.j || "").split("").map(c => h("span", {class: "dot " + c,
        title: {G: "GOOD", B: "BAD", "?": "not judged"}[c]}))));
    cells.push(h("td", {}, Object.entries(r.kept || {}).map(([s, n]) =>
        badge(s + " " + n + "/" + r.nt, "kept"))));
  }
  cells.push(answerCell(r), h("td", {class: "q", title: r.q}, r.q));
  return h("tr", {class: "row" + (r.v ? " is-void" : "")}, cells);
}

function detailRow(r) {
  const span = M.groups.some(g => g.stats.steps !== undefined) ? 11 : 9;
  const td = h("td", {colspan: span}, h("div", {class: "muted"}, "loading…"));
  showDetail(r, td);
  return h("tr", {class: "detail-row"}, td);
}

function showDetail(r, box) {
  const g = groupOf(r);
  const run = M.runs[g.run];
  Promise.all([load(g.chunks[r.c]), run.vocab ? load(run.vocab) : Promise.resolve(null)])
    .then(([d, vocab]) => box.replaceChildren(detailView(r, d.items[r.k], d.prompts, vocab)))
    .catch(err => box.replaceChildren(h("div", {class: "problems"}, "error: " + err.message)));
}

// ------------------------------------------------------------- one trajectory.

function tokens(turn, vocab) {
  const box = h("div", {class: "action"});
  if (!vocab) {
    box.appendChild(h("div", {class: "plain"}, turn.x));
    const strip = h("div", {class: "strip", title: "one cell per action token, shaded by its log-prob"});
    turn.l.forEach((lp, i) => strip.appendChild(h("span",
        {class: "tok", style: `background:${shade(lp)}`, title: `id ${turn.a[i]} · log-prob ${fmt(lp, 2)}`})));
    box.appendChild(strip);
    return box;
  }
  const dec = new TextDecoder("utf-8");
  const frag = document.createDocumentFragment();
  const n = turn.a.length;
  for (let i = 0; i < n; i++) {
    const raw = vocab[turn.a[i]] || "";
    const bytes = new Uint8Array(raw.length);
    for (let j = 0; j < raw.length; j++) bytes[j] = raw.charCodeAt(j);
    let piece = dec.decode(bytes, {stream: i < n - 1});
    const lp = turn.l[i];
    const p = lp === null ? null : Math.exp(lp);
    frag.appendChild(h("span", {class: "tok", style: `background:${shade(lp)}`,
        title: `log-prob ${fmt(lp, 2)} · p ${p === null ? "–" : p.toPrecision(2)} · id ${turn.a[i]}`},
        piece));
  }
  box.appendChild(frag);
  return box;
}

// Why a step shows no reply: only an HTTP judge has one, in its cache.
const NO_REPLY = {
  programmatic: "programmatic judge: the step is checked against the task's solution, no reply",
  model: "model judge: P(GOOD) from its next-token distribution, no reply",
  http: "no reply in the judge's cache"};

function stepView(step, g) {
  if (!step) return null;
  const label = step.j === null ? badge("not judged") :
      badge(step.j ? "GOOD" : "BAD", step.j ? "ok" : "no");
  const kept = g.strategies;
  return h("div", {class: "judge"}, "judge: ", label,
      ` P(GOOD) ${fmt(step.pg, 3)} · filters: `,
      kept.map(s => badge(s, step.kept.includes(s) ? "kept" : "dropped",
          step.kept.includes(s) ? "kept by the " + s + " filter" : "dropped by the " + s + " filter")),
      step.reply !== undefined ? h("details", {}, h("summary", {}, "judge's reply"),
          h("pre", {class: "plain"}, step.reply)) :
          h("span", {class: "muted"}, " (" + (NO_REPLY[g.judge] || "no reply stored") + ")"));
}

function turnView(turn, i, vocab, g) {
  const lps = turn.l.filter(x => x !== null);
  const head = h("div", {class: "turn-head"}, `turn ${i + 1} · `,
      turn.v ? badge("VOID", "void", turn.vw) : null,
      turn.v ? h("span", {class: "void-why"}, turn.vw + " · ") : null,
      `stop: ${turn.stop || "–"} · ${turn.a.length} tokens · lowest log-prob ${fmt(lps.length ? Math.min(...lps) : null, 2)}`,
      turn.tool ? " · calls " : null, turn.tool ? h("b", {}, turn.tool) : null,
      turn.ans !== null && turn.ans !== undefined ? " · answers " : null,
      turn.ans !== null && turn.ans !== undefined ? h("b", {}, turn.ans) : null);
  const obs = turn.obs ? h("div", {class: "obs" + (turn.te ? " err" : "")},
      h("div", {class: "obs-label"}, "tool output · masked out of the loss",
        turn.te ? badge("tool error", "err") : null),
      h("pre", {}, turn.obs)) : null;
  return h("div", {class: "turn" + (turn.v ? " void" : "")}, head,
           tokens(turn, vocab), obs, stepView(turn.step, g));
}

function detailView(r, item, prompts, vocab) {
  const mark = item.o === true ? badge("right", "ok") : item.o === false ? badge("wrong", "no") : badge("not checked");
  const head = h("div", {class: "head"}, h("b", {}, item.id), " · ", groupOf(r).name,
      " · reward ", fmt(item.r, 2), " ", mark, " · answer ",
      h("b", {}, item.ans === null ? "(none)" : item.ans),
      r.ref !== undefined ? [" · reference ", h("b", {}, r.ref)] : null,
      r.v ? [" ", badge("VOID trajectory", "void", "out of the policy loss when the void filter is on")] : null,
      r.end.length ? " · ended: " + r.end.join(", ") : null);
  const prompt = h("details", {class: "prompt"}, h("summary", {}, "prompt: " + r.q.slice(0, 160)),
      h("pre", {}, prompts[item.p]));
  return h("div", {class: "detail"}, head, prompt,
      item.turns.map((t, i) => turnView(t, i, vocab, groupOf(r))));
}

// ------------------------------------------------------------- compare.

const C = {a: null, b: null, page: 0, pairs: [], sample: {}};

function defaultPair() {
  const held = M.groups.map((g, i) => i).filter(i => M.groups[i].kind === "heldout");
  if (held.length >= 2) {
    const base = held.find(i => /base|warmstart/.test(M.groups[i].name)) ?? held[0];
    return [base, held.find(i => i !== base)];
  }
  const runs = M.runs.length;
  if (runs > 1) {
    const last = r => { const gs = M.groups.map((g, i) => i).filter(i => M.groups[i].run === r);
                        return gs[gs.length - 1]; };
    return [last(0), last(1)];
  }
  const train = M.groups.map((g, i) => i).filter(i => M.groups[i].kind === "train");
  if (train.length >= 2) return [train[0], train[train.length - 1]];
  return [0, Math.min(1, M.groups.length - 1)];
}

function compareControls() {
  const box = document.getElementById("cmp-controls");
  const pick = (id, label, chosen) => h("label", {}, label, h("select", {id, onchange: refreshCompare},
      M.groups.map((g, i) => h("option", {value: i, selected: i === chosen}, `${g.name} (${g.stats.n})`))));
  const [a, b] = defaultPair();
  box.append(pick("c-a", "A", a), pick("c-b", "B", b),
      h("label", {}, "problems", h("select", {id: "c-show", onchange: () => { C.page = 0; renderCompare(); }},
          [["", "all"], ["b", "B better"], ["a", "A better"], ["diff", "A and B differ"]].map(
              ([v, t]) => h("option", {value: v}, t)))),
      h("label", {}, "search (id, question)", h("input", {id: "c-search", type: "search",
          oninput: () => { C.page = 0; renderCompare(); }})));
}

function refreshCompare() {
  C.a = +value("c-a"); C.b = +value("c-b"); C.page = 0;
  document.getElementById("cmp-status").textContent = "loading…";
  Promise.all([load(M.groups[C.a].summary), load(M.groups[C.b].summary)]).then(([ra, rb]) => {
    const by = (rows, g) => {
      const m = new Map();
      rows.forEach(r => { r.g = g; const t = r.id.slice(0, r.id.lastIndexOf("/"));
                          if (!m.has(t)) m.set(t, []); m.get(t).push(r); });
      return m;
    };
    const A = by(ra, C.a), B = by(rb, C.b);
    C.pairs = [...A.keys()].filter(t => B.has(t)).map(t => ({task: t, a: A.get(t), b: B.get(t)}));
    C.onlyA = A.size - C.pairs.length; C.onlyB = B.size - C.pairs.length;
    renderCompare();
  }).catch(err => { document.getElementById("cmp-status").textContent = "error: " + err.message; });
}

function meanOf(rows, key) {
  const xs = rows.map(r => key === "te" ? +(r.te > 0) : r[key]).filter(x => x !== null && x !== undefined);
  return xs.length ? xs.reduce((a, b) => a + b, 0) / xs.length : null;
}

function score(rows) { const m = meanOf(rows, "r"); return m === null ? meanOf(rows, "o") : m; }

function compareSummary() {
  const ga = M.groups[C.a], gb = M.groups[C.b];
  const rowsA = C.pairs.flatMap(p => p.a), rowsB = C.pairs.flatMap(p => p.b);
  const stats = [["trajectories", r => r.length], ["reward", r => meanOf(r, "r")],
      ["accuracy", r => meanOf(r, "o")], ["void rate", r => meanOf(r, "v")],
      ["tool error rate", r => meanOf(r, "te")], ["turns", r => meanOf(r, "nt")],
      ["tokens", r => meanOf(r, "nk")], ["lowest token log-prob", r => meanOf(r, "ml")]];
  const head = h("tr", {}, h("th", {}, `on the ${C.pairs.length} problems both answered`),
      h("th", {}, "A: " + ga.name), h("th", {}, "B: " + gb.name), h("th", {}, "B − A"));
  const body = stats.map(([name, f]) => {
    const x = f(rowsA), y = f(rowsB);
    return h("tr", {}, h("td", {}, name), h("td", {}, fmt(x, name === "trajectories" ? undefined : 3)),
        h("td", {}, fmt(y, name === "trajectories" ? undefined : 3)),
        h("td", {}, x === null || y === null ? "–" : (y - x >= 0 ? "+" : "") + fmt(y - x, name === "trajectories" ? 0 : 3)));
  });
  let better = 0, worse = 0, same = 0;
  for (const p of C.pairs) {
    const d = (score(p.b) ?? 0) - (score(p.a) ?? 0);
    if (d > 1e-9) better++; else if (d < -1e-9) worse++; else same++;
  }
  const box = document.getElementById("cmp-summary");
  box.replaceChildren(h("table", {class: "stats", id: "cmp-table"}, h("thead", {}, head), h("tbody", {}, body)),
      h("div", {class: "sub"}, `per problem (mean reward of its samples): B better on ${better}, A better on ${worse}, ` +
        `equal on ${same}; only in A: ${C.onlyA}, only in B: ${C.onlyB}`));
}

function renderCompare() {
  if (C.a === null) return;
  compareSummary();
  const show = value("c-show"), q = value("c-search").trim().toLowerCase();
  const pairs = C.pairs.filter(p => {
    const d = (score(p.b) ?? 0) - (score(p.a) ?? 0);
    if (show === "b" && !(d > 1e-9)) return false;
    if (show === "a" && !(d < -1e-9)) return false;
    if (show === "diff" && Math.abs(d) <= 1e-9) return false;
    return !q || (p.task + "\n" + p.a[0].q).toLowerCase().includes(q);
  });
  const pages = Math.max(1, Math.ceil(pairs.length / PER_PAGE));
  C.page = Math.min(C.page, pages - 1);
  document.getElementById("cmp-status").textContent = `${pairs.length} of ${C.pairs.length} problems shown`;
  const dots = rows => rows.map(r => h("span", {class: "dot " + (r.o === 1 ? "right" : r.o === 0 ? "wrong" : ""),
      title: `${r.id}: reward ${fmt(r.r, 2)}${r.v ? ", void" : ""}`}));
  const body = h("tbody");
  for (const p of pairs.slice(C.page * PER_PAGE, (C.page + 1) * PER_PAGE)) {
    const open = C.sample[p.task] !== undefined;
    const tr = h("tr", {class: "row" + (open ? " open" : "")}, h("td", {}, p.task),
        h("td", {}, dots(p.a), " ", fmt(score(p.a), 2)), h("td", {}, dots(p.b), " ", fmt(score(p.b), 2)),
        h("td", {class: "q", title: p.a[0].q}, p.a[0].q));
    tr.addEventListener("click", () => {
      if (open) delete C.sample[p.task]; else C.sample[p.task] = [0, 0];
      renderCompare();
    });
    body.appendChild(tr);
    if (open) body.appendChild(h("tr", {class: "detail-row"}, h("td", {colspan: 4}, sideBySide(p))));
  }
  const head = h("tr", {}, ["problem", "A: samples (mean)", "B: samples (mean)", "question"].map(c => h("th", {}, c)));
  document.getElementById("cmp-rows").replaceChildren(h("table", {class: "rows"}, h("thead", {}, head), body));
  pager(document.getElementById("cmp-pager"), pages, C.page, n => { C.page = n; renderCompare(); });
}

function sideBySide(p) {
  const [ia, ib] = C.sample[p.task];
  const side = (rows, idx, which) => {
    const box = h("div", {});
    const sel = h("div", {class: "sel"}, "sample: ", rows.map((r, i) => h("button", {type: "button",
        class: i === idx ? "on" : "", onclick: ev => { ev.stopPropagation();
          C.sample[p.task][which] = i; renderCompare(); }}, String(i))));
    const body = h("div", {}, "loading…");
    showDetail(rows[Math.min(idx, rows.length - 1)], body);
    box.append(h("h3", {}, (which ? "B: " : "A: ") + groupOf(rows[0]).name), sel, body);
    return box;
  };
  return h("div", {class: "cmp"}, side(p.a, ia, 0), side(p.b, ib, 1));
}

// ------------------------------------------------------------- start.

function tabs() {
  for (const b of document.querySelectorAll("#tabs button")) {
    b.addEventListener("click", () => {
      for (const o of document.querySelectorAll("#tabs button")) o.classList.toggle("on", o === b);
      document.getElementById("list-tab").hidden = b.dataset.tab !== "list";
      document.getElementById("compare-tab").hidden = b.dataset.tab !== "compare";
      if (b.dataset.tab === "compare" && C.a === null) refreshCompare();
    });
  }
}

header();
S.groups = new Set(defaultGroups());
controls();
compareControls();
tabs();
refreshRows();
