// belay ui: one page over the registry and the runs' event logs.
// Everything shown is built with text nodes (never innerHTML): what an agent
// wrote is data, not markup.
'use strict';

const B = (window.__belay = { seen: {}, dupes: 0, received: 0, listReadyMs: null, view: null });
const enc = encodeURIComponent;
// The token is in the page's address (the URL `belay ui` printed); every
// request carries it: fetches in a header, streams and links in the query.
const TOKEN = new URLSearchParams(location.search).get('token') || '';
const withToken = (url) => url + (url.includes('?') ? '&' : '?') + 'token=' + enc(TOKEN);

function h(tag, attrs, ...kids) {
  const el = document.createElement(tag);
  setAttrs(el, attrs);
  add(el, kids);
  return el;
}
function svg(tag, attrs, ...kids) {
  const el = document.createElementNS('http://www.w3.org/2000/svg', tag);
  setAttrs(el, attrs);
  add(el, kids);
  return el;
}
function setAttrs(el, attrs) {
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k.startsWith('on')) el.addEventListener(k.slice(2), v);
    else el.setAttribute(k, v === true ? '' : String(v));
  }
}
function add(el, kids) {
  for (const k of kids.flat(3)) {
    if (k === null || k === undefined || k === false) continue;
    el.append(k instanceof Node ? k : document.createTextNode(String(k)));
  }
}
function clear(el) { while (el.firstChild) el.firstChild.remove(); return el; }
function put(el, ...kids) { clear(el); add(el, kids); return el; }

async function api(path, opts) {
  const o = Object.assign({ credentials: 'omit' }, opts || {});
  o.headers = Object.assign({ Authorization: 'Bearer ' + TOKEN }, o.headers || {});
  const r = await fetch(path, o);
  const ct = r.headers.get('content-type') || '';
  const body = ct.includes('json') ? await r.json() : await r.text();
  if (!r.ok) throw new Error((body && body.error) || body || r.statusText);
  return body;
}

function toast(text, error) {
  const t = document.getElementById('toast');
  t.textContent = text;
  t.className = 'toast' + (error ? ' error' : '');
  t.hidden = false;
  clearTimeout(toast.timer);
  toast.timer = setTimeout(() => { t.hidden = true; }, 6000);
}

function dur(s) {
  if (s === null || s === undefined || isNaN(s)) return '–';
  if (s < 1) return Math.round(s * 1000) + ' ms';
  if (s < 60) return s.toFixed(1) + ' s';
  if (s < 3600) return Math.floor(s / 60) + 'm' + String(Math.floor(s % 60)).padStart(2, '0') + 's';
  return Math.floor(s / 3600) + 'h' + String(Math.floor((s % 3600) / 60)).padStart(2, '0') + 'm';
}
const when = (iso) => (iso ? iso.replace('T', ' ').slice(0, 19) : '–');
const cost = (c) => '$' + (c || 0).toFixed(4);
const ms = (iso) => (iso ? Date.parse(iso) : NaN);
const badge = (text, cls) => h('span', { class: 'badge ' + (cls || text) }, text);
const short = (s, n) => (s && s.length > n ? s.slice(0, n) + '…' : s || '');

// ---- the registry stream: the list and the attention count stay live ----

// Throttled, not debounced: a change schedules one refresh 120 ms on, and
// changes meanwhile ride on it. While runs finish faster than the timer, the
// list still refreshes every 120 ms (a debounce restarted by every change
// never fired under load).
let regTimer = null;
function registryStream() {
  const es = new EventSource(withToken('/api/stream'));
  // The one stream every page has: the connection indicator follows it
  // (a dead server shows as reconnecting on every page), and the header's
  // attention count is fetched when it (re)opens, not only on a change.
  es.onopen = () => {
    setConn('live');
    refreshAttention();
  };
  es.onerror = () => setConn(es.readyState === EventSource.CLOSED ? 'closed' : 'reconnecting');
  es.addEventListener('changed', () => {
    if (regTimer) return;
    regTimer = setTimeout(() => {
      regTimer = null;
      refreshAttention();
      if (B.view && B.view.onRegistry) B.view.onRegistry();
    }, 120);
  });
}

// The header's count (and the list's cards) after every registry change;
// the patches of held changes only for the attention page (`withDiffs`).
async function refreshAttention(withDiffs) {
  try {
    const a = await api('/api/attention' + (withDiffs ? '?diff=1' : ''));
    const n = a.items.length;
    const c = document.getElementById('attention-count');
    c.textContent = n;
    c.classList.toggle('hot', n > 0);
    return a.items;
  } catch (e) {
    return [];
  }
}

function setConn(state) {
  const c = document.getElementById('conn');
  c.dataset.state = state;
  c.textContent = state;
}

// ---- approvals ----

function actionButtons(actions, after) {
  return (actions || []).map((a) =>
    h('button', {
      class: /decline|discard/.test(a.verb) ? 'danger' : 'primary',
      'data-verb': a.verb, 'data-id': a.id,
      onclick: async (ev) => {
        const b = ev.currentTarget;
        b.disabled = true;
        try {
          const r = await api('/api/act', {
            method: 'POST',
            headers: { 'content-type': 'application/json' },
            body: JSON.stringify(a),
          });
          toast(r.message);
        } catch (e) {
          toast(e.message, true);
        }
        b.disabled = false;
        if (after) after();
        refreshAttention();
      },
    }, a.label));
}

function attentionCard(it, after) {
  return h('div', { class: 'card attention', 'data-kind': it.kind, 'data-id': it.id },
    h('div', {}, badge(it.kind.replace('_', ' '), 'waiting'), ' ',
      it.kind.startsWith('job') && !it.run ? h('strong', {}, it.id) : h('a', { href: '#/run/' + enc(it.run || it.id) }, it.id),
      ' — ', it.reason),
    it.detail ? h('pre', {}, it.detail) : null,
    it.diff ? h('details', { class: 'held-diff', open: true }, h('summary', {}, 'the change you approve'), diffView(it.diff)) : null,
    h('div', { class: 'actions' }, actionButtons(it.actions, after)));
}

async function attentionView(root) {
  const draw = async () => {
    const items = await refreshAttention(true);
    put(root, h('h1', {}, 'Needs attention'),
      items.length ? items.map((it) => attentionCard(it, draw)) : h('p', { class: 'muted' }, 'Nothing waits for you.'));
  };
  await draw();
  return { onRegistry: draw };
}

// ---- all runs ----

const filters = { mode: '', status: '', failed: false, attention: false, q: '', page: 0 };
const PAGE = 200;

async function listView(root) {
  const t0 = performance.now();
  const table = h('table', { id: 'runs' });
  const att = h('div', { id: 'attention' });
  const sel = (name, opts) => h('select', { id: 'filter-' + name, onchange: (e) => { filters[name] = e.target.value; filters.page = 0; draw(); } },
    opts.map((o) => { const x = h('option', { value: o }, o || 'all'); if (filters[name] === o) x.selected = true; return x; }));
  const box = (name, label) => h('label', {}, h('input', { type: 'checkbox', id: 'filter-' + name, checked: filters[name], onchange: (e) => { filters[name] = e.target.checked; filters.page = 0; draw(); } }), ' ', label);
  let searchTimer = null;
  const search = h('input', { type: 'search', id: 'filter-q', placeholder: 'search runs: id, title, outcome, repository', value: filters.q,
    oninput: (e) => { clearTimeout(searchTimer); searchTimer = setTimeout(() => { filters.q = e.target.value.trim(); filters.page = 0; draw(); }, 200); } });
  const pager = h('div', { class: 'pager', id: 'pager' });
  put(root, 
    h('h1', {}, 'Runs'), att,
    h('div', { class: 'filters' },
      h('label', {}, 'Mode ', sel('mode', ['', 'env', 'pipeline', 'agent', 'plan', 'rounds', 'jobs'])),
      h('label', {}, 'Status ', sel('status', ['', 'running', 'ok', 'failed', 'interrupted'])),
      box('failed', 'failed only'), box('attention', 'needs attention'), search),
    table, pager);
  let gen = 0;
  const row = (r) => h('tr', {
    class: 'run', 'data-run-id': r.run_id, 'data-status': r.status, 'data-mode': r.mode,
    onclick: () => { location.hash = '#/run/' + enc(r.run_id); },
  },
  h('td', {}, r.mode),
  h('td', {}, h('a', { href: '#/run/' + enc(r.run_id) }, r.run_id), r.title ? h('div', { class: 'muted' }, short(r.title, 90)) : null),
  h('td', {}, badge(r.status), r.attention ? [' ', badge('attention', 'waiting')] : null,
    (r.status === 'failed' || r.status === 'interrupted') && r.summary ? h('div', { class: 'muted why' }, short(r.summary, 120)) : null),
  h('td', {}, when(r.started_at)),
  h('td', { class: 'num' }, dur(r.duration_s)),
  h('td', { class: 'num' }, r.tokens || 0),
  h('td', { class: 'num' }, cost(r.cost_usd)),
  h('td', {}, r.batch ? h('a', { href: '#/batch/' + enc(r.batch), onclick: (e) => e.stopPropagation() }, 'batch') : null,
    r.attention ? h('div', { class: 'muted' }, short(r.attention, 80)) : null));
  // One fetch at a time: a change while one is out asks for one more when
  // it is back. (Dropping a slow answer for a newer request starved the
  // list whenever fetches took longer than the registry's changes.)
  let inflight = false, again = false;
  async function draw() {
    if (inflight) { again = true; return; }
    inflight = true;
    try { await drawNow(); } finally {
      inflight = false;
      if (again) { again = false; draw(); }
    }
  }
  async function drawNow() {
    const my = ++gen;
    // The server filters, searches and pages: a page holds PAGE runs,
    // newest first, whatever the registry holds.
    const qs = new URLSearchParams({ mode: filters.mode, status: filters.status, failed: filters.failed ? '1' : '', attention: filters.attention ? '1' : '',
      q: filters.q, offset: String(filters.page * PAGE), limit: String(PAGE) });
    const [list, items] = await Promise.all([api('/api/runs?' + qs), refreshAttention()]);
    if (my !== gen) return;
    put(att, items.filter((i) => i.actions.length).map((it) => attentionCard(it, draw)));
    const rows = list.runs;
    const from = list.offset, to = list.offset + rows.length;
    put(pager, h('span', { id: 'page-info', 'data-total': list.total }, list.total ? `${from + 1}–${to} of ${list.total}` : '', list.total !== list.all ? ` (of ${list.all} runs)` : ''), ' ',
      h('button', { id: 'page-newer', disabled: filters.page === 0, onclick: () => { filters.page -= 1; draw(); } }, '← newer'), ' ',
      h('button', { id: 'page-older', disabled: to >= list.total, onclick: () => { filters.page += 1; draw(); } }, 'older →'));
    // The first rows at once (the page is usable), the rest in slices
    // that leave the browser free in between.
    const tbody = h('tbody', {}, rows.slice(0, 100).map(row),
      rows.length ? null : h('tr', {}, h('td', { colspan: 8, class: 'muted' }, 'No runs match.')));
    put(table, h('thead', {}, h('tr', {}, ['Mode', 'Run', 'Status', 'Started', 'Duration', 'Tokens', 'Cost', ''].map((c) => h('th', {}, c)))), tbody);
    let at = 100;
    const more = () => {
      if (my !== gen || at >= rows.length) { if (my === gen) table.dataset.complete = rows.length; return; }
      add(tbody, [rows.slice(at, at + 250).map(row)]);
      at += 250;
      setTimeout(more, 0);
    };
    table.dataset.complete = '';
    setTimeout(more, 0);
  }
  await draw();
  if (B.listReadyMs === null) B.listReadyMs = performance.now();
  B.listDrawMs = performance.now() - t0;
  document.body.dataset.ready = 'list';
  return { onRegistry: draw };
}

// ---- a batch of env builds ----

async function batchView(root, dir) {
  const table = h('table', { id: 'batch' });
  put(root, h('h1', {}, 'Batch ', h('code', {}, dir)), table);
  async function draw() {
    const list = await api('/api/runs?mode=env');
    const rows = list.runs.filter((r) => r.batch === dir).reverse();
    const ok = rows.filter((r) => r.status === 'ok').length;
    put(table, 
      h('caption', { class: 'muted' }, `${rows.length} projects: ${ok} ok, ${rows.filter((r) => r.status === 'failed').length} failed, ${rows.filter((r) => r.status === 'running').length} running`),
      h('thead', {}, h('tr', {}, ['Project', 'Status', 'Started', 'Time', 'Failure'].map((c) => h('th', {}, c)))),
      h('tbody', {}, rows.map((r) => h('tr', { class: 'run', 'data-run-id': r.run_id, 'data-status': r.status, onclick: () => { location.hash = '#/run/' + enc(r.run_id); } },
        h('td', {}, r.run_id), h('td', {}, badge(r.status)), h('td', {}, when(r.started_at)),
        h('td', { class: 'num' }, dur(r.duration_s)),
        h('td', { class: 'failure' }, failureClass(r.summary))))));
  }
  await draw();
  return { onRegistry: draw };
}

function failureClass(summary) {
  if (!summary) return '';
  const first = summary.split('\n')[0];
  const m = first.match(/^([a-z_]+):/);
  return m ? m[1] : short(first, 120);
}

// ---- logs: a piece, live, searched, downloaded ----

function logViewer(runId, path, opts) {
  opts = opts || {};
  const pre = h('pre', { class: 'log', 'data-path': path });
  const hits = h('div', { class: 'hits', hidden: true });
  const q = h('input', { type: 'search', placeholder: 'search this log', class: 'log-search' });
  const info = h('span', { class: 'muted' });
  let to = 0;
  let timer = null;
  const base = `/api/runs/${enc(runId)}/log?path=${enc(path)}`;
  async function load(from) {
    const r = await api(base + (from === undefined ? '' : '&from=' + from));
    if (from === undefined) pre.textContent = r.text;
    else if (r.text) {
      pre.textContent += r.text;
      if (pre.textContent.length > 1 << 20) pre.textContent = pre.textContent.slice(-(1 << 19));
    }
    to = r.to;
    info.textContent = to + ' bytes';
    if (opts.follow) pre.scrollTop = pre.scrollHeight;
  }
  async function search() {
    if (!q.value) { hits.hidden = true; return; }
    const r = await api(base + '&q=' + enc(q.value));
    hits.hidden = false;
    put(hits, r.hits.length ? r.hits.map((x) => h('div', { class: 'hit' }, h('span', { class: 'ln' }, x.line), mark(x.text, q.value)))
      : h('div', { class: 'muted' }, 'no line holds it'), r.more ? h('div', { class: 'muted' }, 'more lines match: the first 500 are shown') : null);
  }
  q.addEventListener('keydown', (e) => { if (e.key === 'Enter') search(); });
  const el = h('div', { class: 'logview' },
    h('div', { class: 'logbar' }, h('code', {}, path), info, q,
      h('button', { onclick: search, class: 'log-search-go' }, 'Search'),
      h('a', { href: withToken(base + '&download=1'), download: path.split('/').pop(), class: 'download' }, 'Download')),
    hits, pre);
  load().catch((e) => { pre.textContent = e.message; });
  if (opts.follow) {
    timer = setInterval(() => {
      if (!el.isConnected) { clearInterval(timer); return; }
      load(to).catch(() => {});
    }, 700);
  }
  el.stop = () => clearInterval(timer);
  return el;
}

function mark(text, needle) {
  const i = text.toLowerCase().indexOf(needle.toLowerCase());
  if (i < 0) return text;
  return [text.slice(0, i), h('mark', {}, text.slice(i, i + needle.length)), text.slice(i + needle.length)];
}

// ---- a commit's patch ----

function diffView(text) {
  const pre = h('pre', { class: 'diff' });
  for (const line of text.split('\n')) {
    const cls = line.startsWith('+++') || line.startsWith('---') || line.startsWith('diff ') ? 'meta'
      : line.startsWith('+') ? 'add' : line.startsWith('-') ? 'del' : line.startsWith('@@') ? 'hunk' : null;
    pre.append(cls ? h('span', { class: cls }, line) : document.createTextNode(line), '\n');
  }
  return pre;
}

// ---- one run ----

const dict = () => Object.create(null);
const has = (o, k) => Object.prototype.hasOwnProperty.call(o, k);

function newModel(d) {
  return {
    id: d.run_id, mode: d.mode, d, lastSeq: 0, t0: NaN, tEnd: NaN, status: d.status, end: null,
    // Maps keyed by names from the log have no prototype: a step called
    // `__proto__` is a step.
    // pipeline
    steps: [], runs: dict(), edges: dict(), current: null, attempt: 1, maxAttempts: null, terminal: null, selected: null,
    // env
    blocks: [], block: dict(), other: [], phases: [],
    // agents
    agents: dict(), agentOrder: [],
    // every other mode's time view
    lanes: dict(), laneOrder: [],
  };
}

function fold(R, v) {
  const t = ms(v.at);
  if (isNaN(R.t0)) R.t0 = t;
  R.tEnd = t;
  const d = v.data || {};
  if (v.kind === 'run_end') {
    R.end = d;
    R.current = null;
  }
  if (v.kind === 'agent' || v.kind === 'agent_report' || v.kind === 'agent_trace') foldAgent(R, v);
  if (R.mode === 'pipeline') foldPipeline(R, v, t, d);
  if (R.mode === 'env') foldEnv(R, v, t, d);
  if (R.mode !== 'env' && R.mode !== 'pipeline') foldLanes(R, v, t);
}

function foldAgent(R, v) {
  const key = v.step || 'agent';
  if (!R.agents[key]) { R.agents[key] = { turns: [], tokens: 0, cost: 0, reports: 0, live: { tokens: 0, cost: 0 }, done: { tokens: 0, cost: 0 } }; R.agentOrder.push(key); }
  const a = R.agents[key];
  // A session's report has its totals; until it comes, its usage events.
  // The plan loop's traces carry each call's cost when its agent's own
  // events are not streamed (the default audit level).
  const settle = () => {
    a.tokens = a.done.tokens + a.live.tokens;
    a.cost = Math.max(a.done.cost + a.live.cost, a.traced || 0);
  };
  if (v.kind === 'agent_trace') {
    const d = v.data || {};
    const who = d.role || d.agent || 'agent';
    if (d.action === 'prompt' && d.prompt) a.turns.push({ kind: 'message', seq: v.seq, text: `${who} was asked:\n${d.prompt}` });
    if (d.action === 'finish') {
      a.traced = (a.traced || 0) + (d.cost_usd || 0);
      settle();
      a.turns.push({ kind: d.outcome && d.outcome !== 'ok' ? 'error' : 'final', seq: v.seq,
        text: `${who} (${d.agent || ''}) ${d.outcome || 'ended'}${d.exit_code != null ? ', exit ' + d.exit_code : ''}${d.duration_s != null ? ' in ' + dur(d.duration_s) : ''}${d.answer ? ':\n' + d.answer : ''}`,
        message: `${who} ${d.outcome || 'ended'}${d.answer ? ': ' + d.answer : ''}` });
    }
    return;
  }
  if (v.kind === 'agent_report') {
    const u = v.data.usage || {};
    a.done.tokens += (u.input_tokens || 0) + (u.output_tokens || 0);
    a.done.cost += v.data.cost_usd || 0;
    a.live = { tokens: 0, cost: 0 };
    a.reports += 1;
    settle();
    a.turns.push({ kind: 'report', seq: v.seq, text: `stopped: ${JSON.stringify(v.data.stop)} after ${v.data.turns} turns; files changed: ${(v.data.files_changed || []).join(', ') || 'none'}` });
    return;
  }
  const e = (v.data && v.data.event) || v.data || {};
  if (e.kind === 'usage') {
    if (e.cumulative) a.live = { tokens: (e.input_tokens || 0) + (e.output_tokens || 0), cost: e.cost_usd || 0 };
    else { a.live.tokens += (e.input_tokens || 0) + (e.output_tokens || 0); a.live.cost += e.cost_usd || 0; }
    settle();
  }
  if (e.kind && e.kind !== 'usage' && e.kind !== 'session') a.turns.push(Object.assign({ seq: v.seq }, e));
}

function foldPipeline(R, v, t, d) {
  switch (v.kind) {
    case 'run_started': case 'run_resumed':
      if (d.steps) R.steps = d.steps;
      R.attempt = d.attempt || R.attempt;
      R.maxAttempts = d.max_attempts;
      break;
    case 'step_start': {
      if (!R.steps.find((s) => s.name === v.step)) R.steps.push({ name: v.step, kind: d.step_kind && d.step_kind.kind });
      (R.runs[v.step] = R.runs[v.step] || []).push({ n: d.n, attempt: d.attempt, start: t, verdict: null, commands: [] });
      R.current = v.step;
      if (!R.userSelected) R.selected = v.step;
      break;
    }
    case 'command': {
      const run = last(R.runs[v.step]);
      if (run) run.commands.push(Object.assign({ at: t }, d));
      break;
    }
    case 'step_end': {
      const run = last(R.runs[v.step]);
      if (run) Object.assign(run, { verdict: d.verdict, exit_code: d.exit_code, duration_s: d.duration_s, end: t });
      break;
    }
    case 'route': {
      const to = String(d.to || '');
      const retry = to.endsWith(' (retry)');
      const target = to.replace(' (retry)', '');
      const key = v.step + '->' + target;
      const e = (R.edges[key] = R.edges[key] || { count: 0, retry });
      e.count += 1;
      e.retry = e.retry || retry;
      const run = last(R.runs[v.step]);
      if (run && d.feedback) run.feedback = d.feedback;
      if (target === 'success' || target === 'failure') R.terminal = target;
      break;
    }
    case 'attempt':
      R.attempt = d.attempt;
      R.maxAttempts = d.max_attempts;
      break;
    default:
  }
}

function foldEnv(R, v, t, d) {
  const b = (id) => (R.block[id] = R.block[id] || { id, title: '', start: NaN, end: NaN, phases: [], repairs: [], status: 'pending' });
  switch (v.kind) {
    case 'plan':
      for (const x of d.blocks || []) { if (!R.block[x.id]) R.blocks.push(x.id); b(x.id).title = x.title; }
      break;
    case 'block_started': {
      if (!R.block[v.step]) R.blocks.push(v.step);
      const x = b(v.step);
      x.title = d.title || x.title;
      if (isNaN(x.start)) x.start = t;
      x.status = 'running';
      break;
    }
    case 'block_finished': case 'cache_hit': {
      if (!R.block[v.step]) R.blocks.push(v.step);
      const x = b(v.step);
      x.end = t;
      x.duration = d.duration_s;
      if (isNaN(x.start)) x.start = t - d.duration_s * 1000;
      x.status = d.ok ? 'ok' : 'failed';
      x.cached = d.cached;
      x.detail = d.detail;
      break;
    }
    case 'checkpoint':
      if (R.block[v.step]) b(v.step).checkpoint = d;
      else R.other.push({ kind: 'checkpoint', step: v.step, d });
      break;
    case 'repair_chosen':
      b(v.step).repairs.push(d);
      break;
    case 'command': case 'validation': case 'repair': case 'oracle': case 'clean_replay': case 'docker_build': case 'preflight':
      if (v.step && R.block[v.step] && !['oracle', 'clean_replay', 'docker_build'].includes(v.kind)) b(v.step).phases.push(Object.assign({ kind: v.kind, at: t }, d));
      else R.other.push({ kind: v.kind, step: v.step, at: t, d });
      break;
    case 'phase':
      R.phases.push({ at: t, phase: d.phase, detail: d.detail });
      break;
    default:
  }
}

const last = (a) => (a && a.length ? a[a.length - 1] : null);

async function runView(root, id) {
  let d = await api('/api/runs/' + enc(id));
  const R = newModel(d);
  const head = h('div', { id: 'run-head' });
  const modeView = h('div', { id: 'mode-view' });
  const agents = h('div', { id: 'agents' });
  const commits = h('div', { id: 'commits' });
  const logs = h('div', { id: 'logs' });
  const evBody = h('tbody', { id: 'events' });
  const evCount = h('span', { class: 'count', id: 'event-count' }, '0');
  put(root, head, modeView,
    h('h2', {}, 'Agents'), agents,
    h('h2', {}, 'Commits'), commits,
    h('h2', {}, 'Logs'), logs,
    h('h2', {}, 'Events ', evCount),
    h('details', { id: 'events-box' }, h('summary', {}, 'every event of the run, as recorded'),
      h('table', {}, h('thead', {}, h('tr', {}, ['seq', 'time', 'source', 'kind', 'step', 'data'].map((c) => h('th', {}, c)))), evBody)));
  let drawPending = false;
  let detailTimer = null;
  const draw = () => {
    drawPending = false;
    drawHead(head, R);
    if (R.mode === 'pipeline') drawPipeline(modeView, R);
    else if (R.mode === 'env') drawEnv(modeView, R);
    else drawGeneric(modeView, R);
    drawAgents(agents, R);
  };
  const schedule = () => { if (!drawPending) { drawPending = true; setTimeout(draw, 30); } };
  const refetch = () => {
    clearTimeout(detailTimer);
    detailTimer = setTimeout(async () => {
      try { d = await api('/api/runs/' + enc(id)); R.d = d; R.status = d.status; drawCommits(commits, R); schedule(); } catch (e) { /* the next event retries */ }
    }, 250);
  };
  const logList = async () => {
    try {
      const l = await api(`/api/runs/${enc(id)}/logs`);
      R.logs = l.logs;
      drawLogs(logs, R);
      if (R.mode === 'pipeline') schedule();
    } catch (e) { /* none yet */ }
  };
  draw();
  drawCommits(commits, R);
  logList();
  // A running step's log is created when its command starts, between
  // events: while a step runs without one listed, the list is asked again.
  const logPoll = setInterval(() => {
    if (R.end || d.status !== 'running') return;
    if (R.mode !== 'pipeline') { if (Date.now() % 5000 < 1000) logList(); return; }
    const run = R.current && last(R.runs[R.current] || []);
    if (!run || run.verdict) return;
    const prefix = 'logs/' + String(run.n).padStart(4, '0') + '-';
    if (!(R.logs || []).some((l) => l.path.startsWith(prefix))) logList();
  }, 1000);
  const es = new EventSource(withToken(`/api/runs/${enc(id)}/events`));
  es.onopen = () => setConn('live');
  es.onerror = () => setConn(es.readyState === EventSource.CLOSED ? 'closed' : 'reconnecting');
  es.onmessage = (m) => {
    let v;
    try { v = JSON.parse(m.data); } catch (e) { return; }
    B.received += 1;
    if (v.seq <= R.lastSeq) { B.dupes += 1; return; }
    if (v.seq !== R.lastSeq + 1) B.gaps = (B.gaps || 0) + 1;
    R.lastSeq = v.seq;
    evBody.append(eventRow(v));
    while (evBody.childElementCount > 5000) evBody.firstElementChild.remove();
    evCount.textContent = R.lastSeq;
    B.seen[v.seq] = Date.now();
    fold(R, v);
    if (/commit|run_end|checkpoint|block_finished|route|step_end/.test(v.kind)) refetch();
    if (/command|step_start|block_finished|run_end/.test(v.kind)) logList();
    // A change of a step's state is drawn at once, so that the page shows
    // every state a step went through, however fast; agents' many turns
    // are drawn together.
    if (STATE_KINDS.has(v.kind)) draw();
    else schedule();
  };
  return {
    onRegistry: refetch,
    close: () => { es.close(); clearInterval(logPoll); },
    model: R,
  };
}

const STATE_KINDS = new Set(['run_started', 'run_resumed', 'step_start', 'step_end', 'route', 'attempt', 'run_end',
  'plan', 'block_started', 'block_finished', 'cache_hit', 'checkpoint', 'repair_chosen']);

function eventRow(v) {
  const data = v.data === null || v.data === undefined ? '' : JSON.stringify(v.data);
  return h('tr', { class: 'event', 'data-seq': v.seq, 'data-kind': v.kind },
    h('td', { class: 'num' }, v.seq), h('td', {}, (v.at || '').slice(11, 23)), h('td', {}, v.source),
    h('td', {}, v.kind), h('td', {}, v.step || ''), h('td', {}, h('code', {}, short(data, 300))));
}

function drawHead(el, R) {
  const d = R.d;
  const status = R.end ? (R.mode === 'pipeline' ? R.end.status : (R.end.ok === false ? 'failed' : R.end.ok ? 'ok' : d.status)) : d.status;
  const running = d.status === 'running' && !R.end;
  const elapsed = d.duration_s != null ? d.duration_s : (!isNaN(R.t0) ? ((running ? Date.now() : R.tEnd) - R.t0) / 1000 : null);
  put(el, 
    h('h1', {}, h('span', { class: 'muted' }, d.mode + ' '), d.run_id, ' ', h('span', { id: 'run-status' }, badge(String(status || '')))),
    d.title ? h('p', {}, d.title) : null,
    h('dl', { class: 'kv' },
      h('dt', {}, 'started'), h('dd', {}, when(d.started_at)),
      h('dt', {}, 'duration'), h('dd', { id: 'run-duration', 'data-since': running && d.duration_s == null && !isNaN(R.t0) ? R.t0 : null }, dur(elapsed)),
      h('dt', {}, 'tokens'), h('dd', { id: 'run-tokens' }, Math.max(d.tokens || 0, sumAgents(R).tokens)),
      h('dt', {}, 'cost'), h('dd', { id: 'run-cost' }, cost(Math.max(d.cost_usd || 0, sumAgents(R).cost))),
      d.summary ? [h('dt', {}, 'outcome'), h('dd', {}, d.summary)] : null,
      h('dt', {}, 'records'), h('dd', {}, h('code', {}, d.dir))),
    d.attention ? h('div', { class: 'card attention', id: 'run-attention' }, d.attention, ' ', actionButtons(d.actions, () => { location.reload(); }),
      d.held_diff ? h('details', { class: 'held-diff', open: true }, h('summary', {}, 'the change you approve'), diffView(d.held_diff)) : null) : null);
}

function sumAgents(R) {
  let tokens = 0, c = 0;
  for (const k of R.agentOrder) { tokens += R.agents[k].tokens; c += R.agents[k].cost; }
  return { tokens, cost: c };
}

// ---- the pipeline's step graph ----

function drawPipeline(el, R) {
  const W = 150, H = 66, GAP = 56, X0 = 20, Y0 = 70;
  const steps = R.steps;
  const names = steps.map((s) => s.name);
  const ends = ['success', 'failure'];
  const x = (name) => {
    const i = names.indexOf(name);
    if (i >= 0) return X0 + i * (W + GAP);
    return X0 + (names.length + ends.indexOf(name)) * (W + GAP) + (ends.indexOf(name) >= 0 ? 0 : 0);
  };
  const width = X0 * 2 + (names.length + 2) * (W + GAP);
  const g = svg('svg', { width, height: 230, viewBox: `0 0 ${width} 230`, id: 'graph' },
    svg('defs', {}, svg('marker', { id: 'arrow', viewBox: '0 0 10 10', refX: 9, refY: 5, markerWidth: 7, markerHeight: 7, orient: 'auto-start-reverse' },
      svg('path', { d: 'M0,0 L10,5 L0,10 z', fill: '#777' }))));
  // Edges: the declared routes, with how often each was taken.
  const declared = [];
  for (const s of steps) {
    for (const [kind, route] of [['pass', s.on_pass], ['fail', s.on_fail], ['unverifiable', s.on_unverifiable]]) {
      if (!route) continue;
      const target = String(route).replace(' (retry)', '');
      if (declared.find((e) => e.from === s.name && e.to === target)) continue;
      declared.push({ from: s.name, to: target, kind, retry: String(route).endsWith('(retry)') });
    }
  }
  for (const key of Object.keys(R.edges)) {
    const [from, to] = key.split('->');
    if (!declared.find((e) => e.from === from && e.to === to)) declared.push({ from, to, kind: 'fail', retry: R.edges[key].retry });
  }
  for (const e of declared) {
    if (e.kind !== 'pass' && !e.retry && !R.edges[e.from + '->' + e.to] && (e.to === 'failure')) continue;
    const taken = R.edges[e.from + '->' + e.to];
    const count = taken ? taken.count : 0;
    const x1 = x(e.from) + W, x2 = x(e.to);
    const back = x(e.to) <= x(e.from);
    let d, lx, ly;
    if (!back && names.indexOf(e.to) === names.indexOf(e.from) + 1 || (!back && ends.includes(e.to) && e.from === last(names))) {
      d = `M${x1},${Y0 + H / 2} L${x2},${Y0 + H / 2}`; lx = (x1 + x2) / 2; ly = Y0 + H / 2 - 6;
    } else if (!back) {
      const mid = (x1 + x2) / 2;
      d = `M${x(e.from) + W / 2},${Y0} C${x(e.from) + W / 2},${Y0 - 50} ${x2 + W / 2},${Y0 - 50} ${x2 + W / 2},${Y0}`; lx = mid; ly = Y0 - 42;
    } else {
      const a = x(e.from) + W / 2, b = x(e.to) + W / 2;
      d = `M${a},${Y0 + H} C${a},${Y0 + H + 70} ${b},${Y0 + H + 70} ${b},${Y0 + H}`; lx = (a + b) / 2; ly = Y0 + H + 62;
    }
    const cls = 'edge' + (e.retry ? ' retry' : '') + (count ? ' taken' : ' untaken');
    // A taken edge says how often; a retry edge never taken says only that
    // it is a retry, drawn faint: the two never read alike.
    const label = count ? (e.retry ? `↺ retried ×${count}` : `×${count}`) : e.retry ? '↺ retry (not taken)' : null;
    g.append(svg('g', { class: cls, 'data-from': e.from, 'data-to': e.to, 'data-count': count, 'data-kind': e.kind },
      svg('path', { d, 'marker-end': 'url(#arrow)' }),
      label ? svg('text', { x: lx, y: ly, 'text-anchor': 'middle', class: 'edge-count' }, label) : null));
  }
  for (const s of steps) {
    const runs = R.runs[s.name] || [];
    const lr = last(runs);
    const state = !lr ? 'pending' : lr.verdict ? lr.verdict : 'running';
    const cls = 'node' + (R.current === s.name ? ' current' : '') + (R.selected === s.name ? ' selected' : '');
    const nx = x(s.name);
    // Each run of the step as a dot in its verdict's colour (a failed first
    // attempt shows beside the passing second), then the step's time: its
    // runs' durations added up, ticking while one runs.
    const shown = runs.slice(-8);
    const spent = runs.reduce((a, r) => a + (r.duration_s != null ? r.duration_s : 0), 0);
    const open = runs.find((r) => r.verdict === null);
    const dx = nx + 12 + shown.length * 9 + (runs.length > shown.length ? 14 : 0);
    g.append(svg('g', { class: cls, 'data-step': s.name, 'data-badge': state, 'data-runs': runs.length,
      onclick: () => { R.selected = s.name; R.userSelected = true; drawPipeline(el, R); } },
      svg('rect', { x: nx, y: Y0, width: W, height: H }),
      svg('text', { x: nx + 10, y: Y0 + 18, class: 'name' }, short(s.name, 20)),
      svg('text', { x: nx + 10, y: Y0 + 34, class: 'kind' }, s.kind || ''),
      runs.length > shown.length ? svg('text', { x: nx + 8, y: Y0 + H - 9, class: 'kind' }, '…') : null,
      shown.map((r, i) => svg('circle', { cx: nx + 14 + (runs.length > shown.length ? 10 : 0) + i * 9, cy: Y0 + H - 13, r: 3.5, class: 'run-dot', 'data-verdict': r.verdict || 'running' },
        svg('title', {}, `#${r.n} attempt ${r.attempt}: ${r.verdict || 'running'}`))),
      runs.length ? svg('text', { x: dx, y: Y0 + H - 9, class: 'kind step-time', 'data-since': open ? open.start - spent * 1000 : null }, dur(open ? spent + (Date.now() - open.start) / 1000 : spent)) : null,
      svg('rect', { x: nx + W - 64, y: Y0 + H - 20, width: 58, height: 14, rx: 6, class: 'pill' }),
      svg('text', { x: nx + W - 35, y: Y0 + H - 9, 'text-anchor': 'middle', class: 'pill-text' }, state)));
  }
  for (const t of ends) {
    const tx = x(t) + W / 2;
    g.append(svg('g', { class: 'terminal ' + t + (R.terminal === t ? ' reached' : ''), 'data-terminal': t },
      svg('circle', { cx: tx, cy: Y0 + H / 2, r: 14 }),
      svg('text', { x: tx, y: Y0 + H / 2 + 32, 'text-anchor': 'middle' }, t)));
  }
  const att = R.maxAttempts ? `attempt ${R.attempt} of ${R.maxAttempts}` : '';
  const graphBox = el.querySelector('.graph') || h('div', { class: 'graph' });
  put(graphBox, g);
  if (!el.querySelector('.graph')) put(el, h('h2', {}, 'Steps ', h('span', { class: 'muted', id: 'attempts' })), graphBox, h('div', { id: 'time-view' }), h('div', { id: 'console' }));
  el.querySelector('#attempts').textContent = att;
  drawPipelineTime(el.querySelector('#time-view'), R);
  drawConsole(el.querySelector('#console'), R);
}

function drawConsole(el, R) {
  const step = R.selected;
  if (!step) { put(el, h('p', { class: 'muted' }, 'No step has run yet.')); return; }
  const runs = R.runs[step] || [];
  const key = step + ':' + runs.map((r) => `${r.n}/${r.verdict}/${r.commands.length}/${r.feedback ? 1 : 0}`).join(',') + ':' + (R.logs || []).length;
  if (el.dataset.key === key) return;
  el.dataset.key = key;
  for (const v of el.querySelectorAll('.logview')) v.stop && v.stop();
  put(el, h('h2', {}, 'Console: ', h('span', { id: 'console-step' }, step)),
    runs.length ? null : h('p', { class: 'muted' }, 'This step has not run.'),
    runs.slice().reverse().map((r) => {
      const prefix = 'logs/' + String(r.n).padStart(4, '0') + '-';
      const files = (R.logs || []).filter((l) => l.path.startsWith(prefix) && !l.path.includes('/tools'));
      return h('div', { class: 'card step-run', 'data-n': r.n, 'data-verdict': r.verdict || 'running' },
        h('div', {}, h('strong', {}, `#${r.n}`), ` attempt ${r.attempt} `, badge(r.verdict || 'running'),
          r.exit_code !== null && r.exit_code !== undefined ? ` exit code ${r.exit_code}` : '',
          ' · ', h('span', { class: 'elapsed', 'data-since': r.verdict ? null : r.start }, dur(r.duration_s != null ? r.duration_s : (Date.now() - r.start) / 1000))),
        r.commands.map((c) => h('div', { class: 'muted' }, `${c.what}: `, h('code', {}, short(c.command, 200)), ` → exit ${c.exit_code}${c.timed_out ? ' (timed out)' : ''} in ${dur(c.duration_s)}`)),
        r.feedback ? [h('div', {}, 'Feedback to the next attempt:'), h('pre', { class: 'feedback' }, r.feedback)] : null,
        files.map((f) => logViewer(R.id, f.path, { follow: !r.verdict })));
    }));
}

// ---- time views: lanes of spans on one time axis ----

// rows: [{ key, label, sub, status, spans: [{ start, end, cls, title }] }]
// (times in ms; an open span ends now). As Buildkite's waterfall: one row
// per job, its attempts and phases as bars, its duration at the end.
function timeView(el, id, rows, t0, tEnd, legend) {
  const end = Math.max(tEnd, ...rows.flatMap((r) => r.spans.map((s) => s.end || Date.now())));
  const total = Math.max(1, end - t0);
  const pct = (t) => Math.max(0, Math.min(100, ((t - t0) / total) * 100));
  put(el, legend ? h('div', { class: 'legend' }, legend.map(([cls, l]) => h('span', {}, h('i', { class: 'sw ' + cls }), l))) : null,
    h('table', { class: 'waterfall', id },
      h('thead', {}, h('tr', {}, ['', 'Status', 'Timeline', 'Duration'].map((c) => h('th', {}, c)))),
      h('tbody', {}, rows.length ? rows.map((r) => {
        const first = Math.min(...r.spans.map((x) => x.start));
        const open = r.spans.some((x) => !x.end);
        const last = Math.max(...r.spans.map((x) => x.end || Date.now()));
        const lane = h('div', { class: 'lane' }, r.spans.map((x) => h('div', { class: 'span ' + (x.cls || ''), title: x.title || '',
          'data-left': pct(x.start), 'data-width': pct(x.end || Date.now()) - pct(x.start) })));
        return h('tr', { class: 'time-row', 'data-key': r.key, 'data-status': r.status || '' },
          h('td', {}, h('strong', {}, r.label), r.sub ? h('div', { class: 'muted' }, r.sub) : null),
          h('td', {}, badge(r.status || 'running')),
          h('td', { class: 'bar' }, lane),
          h('td', { class: 'num duration', 'data-since': open ? first : null }, dur((last - first) / 1000)));
      }) : h('tr', {}, h('td', { colspan: 4, class: 'muted' }, 'Nothing has run yet.')))));
  for (const s of el.querySelectorAll('.lane .span')) {
    s.style.left = s.dataset.left + '%';
    s.style.width = Math.max(0.3, Number(s.dataset.width)) + '%';
  }
}

// A pipeline's step runs in order: each attempt's span in its verdict's
// colour, its commands inside it where they ran.
function drawPipelineTime(el, R) {
  const rows = [];
  for (const s of R.steps) {
    for (const r of R.runs[s.name] || []) {
      const spans = [{ start: r.start, end: r.end, cls: 'step ' + (r.verdict || 'running'), title: `${s.name} #${r.n}: ${r.verdict || 'running'}` }];
      for (const c of r.commands) {
        if (c.at && c.duration_s != null) spans.push({ start: c.at - c.duration_s * 1000, end: c.at, cls: 'cmd' + (c.exit_code ? ' failed' : ''), title: `${c.what}: exit ${c.exit_code} in ${dur(c.duration_s)}` });
      }
      rows.push({ key: `${s.name}#${r.n}`, label: s.name, sub: `#${r.n} · attempt ${r.attempt}`, status: r.verdict || 'running', spans, n: r.n });
    }
  }
  rows.sort((a, b) => a.n - b.n);
  const key = rows.map((r) => r.key + r.status + r.spans.length).join(',');
  if (el.dataset.key === key && !rows.some((r) => r.status === 'running')) return;
  el.dataset.key = key;
  timeView(el, 'timeline', rows, R.t0, R.end ? R.tEnd : Date.now(),
    [['step pass', 'passed'], ['step fail', 'failed'], ['step running', 'running'], ['cmd', 'command']]);
}

// Every other mode: a lane per step of its log (a checkpoint, a round, a
// job's phase), its spans from event to event, named by the event that
// opened each.
function foldLanes(R, v, t) {
  if (v.kind === 'run_end' || v.kind === 'run_outcome') {
    for (const k of R.laneOrder) { const x = last(R.lanes[k].spans); if (x && !x.end) x.end = t; }
    return;
  }
  if (v.kind === 'run_started' || v.kind === 'run_resumed') return;
  const key = v.step || (v.source === 'agent' ? 'agent' : 'run');
  let l = R.lanes[key];
  if (!l) { l = R.lanes[key] = { key, spans: [], failed: false }; R.laneOrder.push(key); }
  // The modes drawn here run one step at a time: a step's open span ends
  // where the next event, of any step, comes.
  if (R.laneLast && R.laneLast !== key) { const x = last(R.lanes[R.laneLast].spans); if (x && !x.end) x.end = t; }
  R.laneLast = key;
  const cur = last(l.spans);
  const kind = v.kind;
  if (!cur || cur.end || cur.kind !== kind) {
    if (cur && !cur.end) cur.end = t;
    l.spans.push({ kind, start: t, end: null });
  }
  if (/fail|error|tamper|revert/.test(v.kind)) l.failed = true;
  if (l.spans.length > 400) l.spans.splice(0, l.spans.length - 400);
}

function drawLaneTime(el, R) {
  const done = !!R.end || R.d.status !== 'running';
  const rows = R.laneOrder.map((k) => {
    const l = R.lanes[k];
    const spans = l.spans.map((x) => ({ start: x.start, end: x.end || (done ? R.tEnd : null), cls: 'k-' + kindClass(x.kind), title: x.kind }));
    return { key: k, label: k, sub: `${l.spans.length} phase(s)`, status: l.failed ? 'failed' : spans.some((x) => !x.end) ? 'running' : 'ok', spans };
  });
  timeView(el, 'timeline', rows, R.t0, R.tEnd, null);
}

// The colour class of an event kind: a handful, by what it is.
function kindClass(kind) {
  if (/fail|error|tamper|revert/.test(kind)) return 'failed';
  if (/review|approval/.test(kind)) return 'review';
  if (/gate|check|validation/.test(kind)) return 'gate';
  if (/commit|stash|push|publish|held/.test(kind)) return 'commit';
  if (/agent/.test(kind)) return 'agent';
  return 'other';
}

// ---- an env build's block timeline ----

function drawEnv(el, R) {
  const d = R.d;
  const m = d.manifest || {};
  const end = R.end ? R.tEnd : Math.max(Date.now(), R.tEnd || 0);
  const total = Math.max(1, (end - R.t0) || 1);
  const pct = (t) => Math.max(0, Math.min(100, ((t - R.t0) / total) * 100));
  const cps = {};
  for (const c of m.checkpoints || []) cps[c.block_id] = c;
  const rows = R.blocks.map((id) => {
    const b = R.block[id];
    const cp = b.checkpoint || (cps[id] && { image_ref: cps[id].image_ref, kind: cps[id].kind, cached: !!cps[id].cached_from });
    const startT = isNaN(b.start) ? NaN : b.start;
    const endT = isNaN(b.end) ? (b.status === 'running' ? end : NaN) : b.end;
    const lane = h('div', { class: 'lane' });
    if (!isNaN(startT) && !isNaN(endT)) {
      lane.append(h('div', { class: 'span block-span' + (b.cached ? ' cached' : b.status === 'failed' ? ' failed' : ''), style: null, 'data-left': pct(startT), 'data-width': pct(endT) - pct(startT) }));
      // Each phase where it ran: it ended at its event; it began its duration before.
      for (const p of b.phases) {
        // A phase runs inside its block: it never starts before the block did.
        const pe = p.at, ps = Math.max(startT, p.at - (p.duration_s || 0) * 1000);
        lane.append(h('div', { class: 'span ' + p.kind + (p.exit_code && p.exit_code !== 0 ? ' failed' : ''), 'data-left': pct(ps), 'data-width': pct(pe) - pct(ps), title: `${p.phase} attempt ${p.attempt}: exit ${p.exit_code} in ${dur(p.duration_s)}` }));
      }
    }
    const duration = b.duration != null ? b.duration : (!isNaN(startT) && b.status === 'running' ? (end - startT) / 1000 : null);
    return h('tr', { class: 'block', 'data-block': id, 'data-status': b.status, 'data-duration': duration != null ? duration.toFixed(3) : '', 'data-checkpoint': cp ? cp.image_ref : '' },
      h('td', {}, h('strong', {}, id), h('div', { class: 'muted' }, short(b.title, 60))),
      h('td', {}, badge(b.status), b.cached ? [' ', badge('cache hit', 'cached')] : null),
      h('td', { class: 'bar' }, lane),
      h('td', { class: 'num duration' }, dur(duration)),
      h('td', { class: 'checkpoint' }, cp ? h('code', {}, cp.image_ref) : '–', cp && cp.cached ? h('div', { class: 'muted' }, 'from the cache') : null),
      h('td', { class: 'phases' }, phaseSummary(b.phases)),
      h('td', { class: 'repairs' }, b.repairs.map((r) => h('div', { class: 'repair', 'data-rule': r.rule }, h('code', {}, r.rule), ` (attempt ${r.attempt}): ${short(r.hint, 100)}`))));
  });
  const others = R.other.filter((o) => o.kind !== 'checkpoint').map((o) => h('tr', { class: 'phase-row', 'data-kind': o.kind },
    h('td', {}, o.kind.replace('_', ' ')), h('td', {}, o.step || ''), h('td', {}, o.d.phase || ''),
    h('td', {}, o.d.exit_code === 0 ? badge('ok') : badge('exit ' + o.d.exit_code, 'failed')), h('td', { class: 'num' }, dur(o.d.duration_s))));
  const cache = m.cache || {};
  put(el, 
    h('h2', {}, 'Blocks'),
    h('div', { class: 'legend' }, [['', 'block'], ['var(--run)', 'run'], ['#0a9396', 'validation'], ['var(--wait)', 'repair'], ['#6f42c1', 'cache hit']].filter((x) => x[0]).map(([c, l]) => h('span', {}, h('i', { 'data-color': c, class: 'sw-' + l.replace(' ', '-') }), l))),
    h('table', { class: 'waterfall', id: 'timeline' },
      h('thead', {}, h('tr', {}, ['Block', 'Status', 'Timeline', 'Duration', 'Checkpoint', 'Phases', 'Repairs'].map((c) => h('th', {}, c)))),
      h('tbody', {}, rows.length ? rows : h('tr', {}, h('td', { colspan: 7, class: 'muted' }, 'No plan yet.')))),
    others.length ? [h('h2', {}, 'Build, clean replay and oracle'), h('table', { id: 'other-phases' }, h('tbody', {}, others))] : null,
    h('h2', {}, 'Result'),
    h('dl', { class: 'kv', id: 'env-result' },
      h('dt', {}, 'image'), h('dd', {}, m.final_image ? h('code', {}, m.final_image) : (R.end && R.end.final_image) || '–'),
      h('dt', {}, 'cache'), h('dd', {}, `${cache.hits || 0} hits, ${cache.misses || 0} misses`),
      h('dt', {}, 'repairs'), h('dd', {}, String(m.repairs || 0)),
      h('dt', {}, 'clean replay'), h('dd', { id: 'clean-replay' }, m.final_clean_replay_ok === true ? badge('ok') : m.final_clean_replay_ok === false ? badge('failed') : '–', ' ', m.final_clean_replay_note || ''),
      h('dt', {}, 'oracle'), h('dd', { id: 'oracle' }, m.oracle ? [badge(m.oracle.ok ? 'ok' : 'failed'), ` ${(m.oracle.commands || []).length} command(s)`] : '–'),
      h('dt', {}, 'error'), h('dd', {}, m.error || (R.end && R.end.error) || '–'),
      h('dt', {}, 'Dockerfile'), h('dd', {}, (d.files || []).includes('Dockerfile') ? h('a', { href: withToken(`/api/runs/${enc(R.id)}/file/Dockerfile`), id: 'dockerfile-link', target: '_blank', rel: 'noopener' }, 'the written Dockerfile') : '–')),
    R.phases.length ? [h('h2', {}, 'Phases'), h('div', { class: 'muted' }, R.phases.slice(-30).map((p) => h('div', {}, `${p.phase}: ${p.detail}`)))] : null);
  // Bars are placed by style properties (the CSP forbids inline style attributes).
  for (const s of el.querySelectorAll('.lane .span')) {
    s.style.left = s.dataset.left + '%';
    s.style.width = Math.max(0.3, Number(s.dataset.width)) + '%';
  }
  for (const i of el.querySelectorAll('.legend i')) i.style.background = i.dataset.color;
}

function phaseSummary(phases) {
  const by = dict();
  for (const p of phases) { const k = p.kind; by[k] = by[k] || { n: 0, s: 0 }; by[k].n += 1; by[k].s += p.duration_s || 0; }
  return Object.entries(by).map(([k, v]) => h('div', { class: 'phase', 'data-phase': k }, `${k} ×${v.n} ${dur(v.s)}`));
}

// ---- the other modes: their state and timeline ----

function drawGeneric(el, R) {
  const st = R.d.state;
  const parts = [];
  if (R.mode === 'plan' && st && st.checkpoints) {
    parts.push(h('h2', {}, 'Checkpoints'), h('table', { id: 'checkpoints' },
      h('thead', {}, h('tr', {}, ['Checkpoint', 'Stage', 'Attempts', 'Failed builds'].map((c) => h('th', {}, c)))),
      h('tbody', {}, st.checkpoints.map((c) => h('tr', { 'data-checkpoint': c.id, 'data-stage': c.stage }, h('td', {}, c.id), h('td', {}, badge(String(c.stage), c.stage === 'approved' ? 'ok' : 'waiting')), h('td', { class: 'num' }, c.attempts), h('td', { class: 'num' }, c.failed_builds))))));
  }
  if (R.d.published) parts.push(h('h2', {}, 'Published'), h('pre', {}, JSON.stringify(R.d.published, null, 2)));
  if ((R.d.files || []).includes('answer.md')) parts.push(h('h2', {}, 'Answer'), h('a', { href: withToken(`/api/runs/${enc(R.id)}/file/answer.md`), id: 'answer-link', target: '_blank', rel: 'noopener' }, 'the whole answer, as sent in part by chat'));
  if (st) parts.push(h('h2', {}, 'State'), h('details', {}, h('summary', {}, 'state.json'), h('pre', {}, JSON.stringify(st, null, 2))));
  const tv = h('div', { id: 'time-view' });
  put(el, h('h2', {}, 'Time'), tv, parts);
  drawLaneTime(tv, R);
}

// ---- agents' turns, tokens and cost ----

function drawAgents(el, R) {
  const key = R.agentOrder.map((k) => k + R.agents[k].turns.length).join(',');
  if (el.dataset.key === key) return;
  el.dataset.key = key;
  if (!R.agentOrder.length) { put(el, h('p', { class: 'muted' }, 'No agent has run.')); return; }
  put(el, R.agentOrder.map((k) => {
    const a = R.agents[k];
    return h('details', { class: 'card agent', 'data-step': k, open: R.agentOrder.length === 1 },
      h('summary', {}, h('strong', {}, k), ` · ${a.turns.length} turns · ${a.tokens} tokens · ${cost(a.cost)}`),
      a.turns.slice(-300).map(turnView));
  }));
}

const TURNS = {
    message: (t) => h('div', { class: 'text' }, t.text),
    tool_call: (t) => [h('code', {}, t.name), ' ', h('pre', {}, short(t.input, 2000))],
    tool_result: (t) => h('pre', {}, short(t.output, 3000)),
    command: (t) => [h('code', {}, short(t.command, 500)), ` → exit ${t.exit_code}`, t.output ? h('pre', {}, short(t.output, 3000)) : null],
    file_change: (t) => [h('code', {}, t.path), ' ', t.change],
    final: (t) => h('div', { class: 'text' }, t.text),
    error: (t) => h('div', { class: 'text' }, t.message),
    report: (t) => h('div', { class: 'text' }, t.text),
};

// One turn; a turn the page does not know (or cannot draw) is shown as its JSON.
function turnView(t) {
  const kind = String(t.kind);
  let body;
  try {
    body = has(TURNS, kind) ? TURNS[kind](t) : JSON.stringify(t);
  } catch (e) {
    body = JSON.stringify(t);
  }
  return h('div', { class: 'turn ' + kind, 'data-kind': kind }, h('div', { class: 'head' }, kind.replace('_', ' ')), body);
}

// ---- commits ----

async function drawCommits(el, R) {
  const shas = R.d.commits || [];
  if (el.dataset.key === shas.join(',')) return;
  el.dataset.key = shas.join(',');
  if (!shas.length) { put(el, h('p', { class: 'muted' }, 'belay made no commit in this run.')); return; }
  const parts = await Promise.all(shas.map(async (s) => {
    let text;
    try { text = await api(`/api/runs/${enc(R.id)}/commits/${s}`); } catch (e) { text = e.message; }
    return h('div', { class: 'card commit', 'data-sha': s }, h('div', {}, 'commit ', h('code', {}, s)), diffView(text));
  }));
  put(el, parts);
}

function drawLogs(el, R) {
  const key = (R.logs || []).map((l) => l.path).join(',');
  if (el.dataset.key === key) return;
  el.dataset.key = key;
  const viewer = h('div', { id: 'log-viewer' });
  const list = (R.logs || []).map((l) => h('li', {}, h('a', { href: '#', 'data-path': l.path, class: 'log-link', onclick: (e) => {
    e.preventDefault();
    for (const v of viewer.querySelectorAll('.logview')) v.stop && v.stop();
    put(viewer, logViewer(R.id, l.path, { follow: R.d.status === 'running' }));
  } }, l.path), h('span', { class: 'muted' }, ` ${l.size} bytes`)));
  put(el, list.length ? h('ul', { class: 'logs' }, list) : h('p', { class: 'muted' }, 'No logs.'), viewer);
}

// ---- routing ----

async function route() {
  if (B.view && B.view.close) B.view.close();
  B.view = null;
  const root = document.getElementById('view');
  const hash = decodeURIComponent(location.hash || '#/');
  document.body.dataset.ready = '';
  try {
    if (hash.startsWith('#/run/')) B.view = await runView(root, hash.slice(6));
    else if (hash.startsWith('#/batch/')) B.view = await batchView(root, hash.slice(8));
    else if (hash.startsWith('#/attention')) B.view = await attentionView(root);
    else { B.view = await listView(root); setConn('live'); }
    if (!document.body.dataset.ready) document.body.dataset.ready = 'view';
  } catch (e) {
    put(root, h('h1', {}, 'Cannot show this'), h('p', {}, e.message));
  }
}

window.addEventListener('hashchange', route);

// Elapsed times of what still runs tick every second, between events.
setInterval(() => {
  for (const el of document.querySelectorAll('[data-since]')) {
    const since = Number(el.dataset.since);
    if (since) el.textContent = dur((Date.now() - since) / 1000);
  }
}, 1000);
registryStream();
route();
