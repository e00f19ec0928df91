"""The status page's script (`status_page.py` puts it into the page it serves, with its style).

Role: a Python string, so the page ships inside the package with no data files. It reads
`GET /v1/admin/state` and `GET /v1/admin/events?after=N` every 2 s (backing off on errors) with
the admin token the operator gives it, kept in the tab's sessionStorage (or taken once from the
address's `#token=` fragment, which it then removes), never in a URL; it puts what they say into
the DOM as text only (`textContent`, never markup), updating the elements in place.
"""

from __future__ import annotations

SCRIPT = r"""
'use strict';
(() => {
  const POLL_MS = 2000, MAX_DELAY_MS = 30000, TIMEOUT_MS = 10000; // poll, back-off cap, a read
  const EVENTS_SHOWN = 100, EVENTS_PAGE = 5000;
  const KEY = 'llmgw-twin.admin-token';
  const TOKEN_RE = /^[\x21-\x7e]{1,256}$/;
  const authRequired = document.body.dataset.auth === 'required';
  const $ = (id) => document.getElementById(id);

  let token = null, timer = null, failures = 0, lastOk = null;
  let run = 0; // bumped to abandon a poll in flight (a new token, a forgotten one)
  let after = 0, origin = null; // the event log: where to read on, and whose log it is
  let events = []; // {seq, t_ms, kind, subjects}, oldest first
  const unplaceable = new Map(); // replica -> its latest replica.unplaceable reason

  // an answer that is not the data: kind 'auth' (401, 403) or 'down' (anything else)
  const failure = (message, kind, retryMs) =>
    Object.assign(new Error(message), {failure: true, kind, retryMs: retryMs || 0});

  function el(tag, cls, text) {
    const e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined) e.textContent = String(text);
    return e;
  }
  function setText(node, text) {
    const t = text === null || text === undefined ? '' : String(text);
    if (node.textContent !== t) node.textContent = t;
  }
  const setClass = (node, cls) => { if (node.className !== cls) node.className = cls; };
  function badge(node, family, value) {
    setClass(node, 'badge ' + family + '-' + value);
    setText(node, value);
  }
  function clock(ms) {
    const d = new Date(ms);
    return d.toTimeString().slice(0, 8) + '.' + String(d.getMilliseconds()).padStart(3, '0');
  }
  const plural = (n, what) => n + ' ' + what + (n === 1 ? '' : 's');
  const natural = (a, b) => String(a).localeCompare(String(b), 'en', {numeric: true});

  // Keep `box`'s children one per item, in order, keyed: existing elements are updated in place.
  function sync(box, items, keyOf, make, update) {
    const old = new Map();
    for (const child of Array.from(box.children)) old.set(child.dataset.key, child);
    let prev = null;
    for (const item of items) {
      const key = String(keyOf(item));
      let node = old.get(key);
      if (node) old.delete(key);
      else {
        node = make(item);
        node.dataset.key = key;
      }
      update(node, item);
      const want = prev ? prev.nextSibling : box.firstChild;
      if (node !== want) box.insertBefore(node, want);
      prev = node;
    }
    for (const node of old.values()) node.remove();
  }
  function row(count) {
    const tr = el('tr');
    for (let i = 0; i < count; i++) tr.appendChild(el('td'));
    return tr;
  }
  const cells = (tr, ...values) => values.forEach((v, i) => setText(tr.children[i], v));

  // --- the token: this tab's sessionStorage, or once from the address's #token= ---------------
  const stored = () => { try { return sessionStorage.getItem(KEY); } catch (e) { return null; } };
  function store(t) {
    try {
      if (t === null) sessionStorage.removeItem(KEY);
      else sessionStorage.setItem(KEY, t);
    } catch (e) { /* no storage: the token lives as long as the page */ }
  }
  function fragmentToken() {
    if (!location.hash) return null;
    const params = new URLSearchParams(location.hash.slice(1));
    if (!params.has('token')) return null;
    history.replaceState(null, '', location.pathname + location.search);
    return params.get('token').trim();
  }

  // --- reading the admin API -------------------------------------------------------------------
  async function getJson(path) {
    const headers = {Accept: 'application/json'};
    if (token !== null) headers.Authorization = 'Bearer ' + token;
    const abort = new AbortController();
    const timeout = setTimeout(() => abort.abort(), TIMEOUT_MS);
    try {
      const r = await fetch(path, {headers, cache: 'no-store', credentials: 'omit',
        redirect: 'error', signal: abort.signal});
      if (r.ok) return await r.json();
      let detail = '';
      try { detail = String((await r.json()).detail || ''); } catch (e) { detail = ''; }
      const what = 'HTTP ' + r.status + (detail ? ': ' + detail : '');
      if (r.status === 401 || r.status === 403) throw failure(what, 'auth');
      throw failure(what, 'down', (Number(r.headers.get('Retry-After')) || 0) * 1000);
    } catch (e) {
      if (e.failure) throw e;
      throw failure(abort.signal.aborted ? 'the controller did not answer in time'
        : 'cannot reach the controller', 'down');
    } finally {
      clearTimeout(timeout);
    }
  }

  function forgetEvents() { after = 0; origin = null; events = []; unplaceable.clear(); }
  function take(seq, ev) {
    const s = ev.subjects || {};
    if (ev.kind === 'replica.unplaceable') {
      unplaceable.delete(s.replica);
      unplaceable.set(s.replica, String(s.reason ?? ''));
      if (unplaceable.size > 10000) unplaceable.delete(unplaceable.keys().next().value);
    } else if (ev.kind === 'replica.reaped') {
      unplaceable.delete(s.replica);
    }
    events.push({seq, t_ms: ev.t_ms, kind: ev.kind, subjects: s});
    if (events.length > 2 * EVENTS_SHOWN) events = events.slice(-EVENTS_SHOWN);
  }
  async function pollEvents() {
    for (let i = 0; i < 400; i++) { // the whole log (at most 200,000) on the first poll
      const page = await getJson('/v1/admin/events?after=' + after + '&limit=' + EVENTS_PAGE);
      if (origin !== null && page.origin_monotonic_ns !== origin) {
        forgetEvents(); // another controller process: read its log again, from the start
        continue;
      }
      origin = page.origin_monotonic_ns;
      const first = page.next - page.events.length;
      page.events.forEach((ev, j) => take(first + j, ev));
      after = page.next;
      if (page.events.length < EVENTS_PAGE) return;
    }
  }

  function schedule(ms) { clearTimeout(timer); timer = setTimeout(cycle, ms); }
  function stop() { run += 1; clearTimeout(timer); }
  async function cycle() {
    const mine = run;
    try {
      await pollEvents();
      const state = await getJson('/v1/admin/state');
      if (mine !== run) return;
      render(state);
      failures = 0;
      lastOk = Date.now();
      showConn('ok', 'live', '');
      schedule(POLL_MS);
    } catch (e) {
      if (mine !== run) return;
      const f = e.failure ? e : failure('page error: ' + e, 'down');
      if (f.kind === 'auth') {
        stop();
        showConn('auth', token === null ? 'admin token needed' : 'token refused', f.message);
        askToken(f.message);
        return;
      }
      failures += 1;
      const delay = Math.max(Math.min(POLL_MS * 2 ** failures, MAX_DELAY_MS), f.retryMs);
      showConn('down', 'disconnected', f.message + '; retrying in ' + delay / 1000 + ' s');
      schedule(delay);
    }
  }

  function showConn(kind, label, detail) {
    document.body.dataset.conn = kind;
    setClass($('conn'), 'conn conn-' + kind);
    setText($('conn-label'), label);
    setText($('conn-detail'), detail);
    setText($('updated'), lastOk === null ? 'never updated' : 'last updated ' + clock(lastOk));
    $('main').classList.toggle('stale', kind !== 'ok');
  }
  function askToken(message) {
    $('token-form').hidden = false;
    setText($('token-error'), message);
    $('forget').hidden = token === null;
    $('token-input').focus();
  }
  function useToken(t) {
    token = t;
    store(t);
    $('token-form').hidden = true;
    $('forget').hidden = false;
    setText($('token-error'), '');
    failures = 0;
    stop();
    showConn('wait', 'connecting', '');
    cycle();
  }
  function forget() {
    stop();
    store(null);
    token = null;
    lastOk = null;
    forgetEvents();
    for (const id of ['summary', 'banners', 'fabrics', 'pending', 'replicas', 'deployments',
      'quarantines', 'events']) $(id).replaceChildren();
    showConn('auth', 'admin token needed', '');
    askToken('');
  }
  $('token-form').addEventListener('submit', (ev) => {
    ev.preventDefault();
    const t = $('token-input').value.trim();
    $('token-input').value = '';
    if (TOKEN_RE.test(t)) useToken(t);
    else setText($('token-error'), 'a token is 1 to 256 printable characters, no spaces');
  });
  $('forget').addEventListener('click', forget);

  // --- rendering: text only ----------------------------------------------------------------------
  function reasonOf(r) {
    if (typeof r.reason === 'string' && r.reason !== '') return r.reason;
    return r.state === 'pending' ? unplaceable.get(r.replica) || '' : '';
  }
  function gpuState(n, g) {
    if (n.failed_gpus.includes(g.index)) return 'failed';
    return g.replica === null ? 'free' : 'used';
  }
  function usedOf(n) {
    return n.gpus.filter((g) => g.replica !== null).length;
  }

  function render(s) {
    const nodes = new Map(s.nodes.map((n) => [n.node, n]));
    const replicas = s.replicas.slice().sort((a, b) => natural(a.model, b.model)
      || natural(a.replica, b.replica));
    renderSummary(s, replicas);
    sync($('fabrics'), s.fabrics, (f) => f.fabric, makeFabric,
      (box, f) => updateFabric(box, f, f.nodes.map((name) => nodes.get(name)).filter(Boolean)));
    sync($('replicas'), replicas, (r) => r.replica, () => row(7),
      (tr, r) => updateReplica(tr, r, nodes));
    const pending = replicas.filter((r) => r.state === 'pending');
    sync($('pending'), pending, (r) => r.replica, makePending, updatePending);
    $('pending-none').hidden = pending.length > 0;
    sync($('deployments'), s.deployments, (d) => d.model, () => row(5), (tr, d) => {
      const mine = replicas.filter((r) => r.model === d.model);
      cells(tr, d.model, d.profile, d.replicas, mine.length,
        mine.filter((r) => r.state === 'ready').length);
    });
    const qs = s.quarantines || [];
    $('quarantines-box').hidden = qs.length === 0;
    sync($('quarantines'), qs, (q) => q.node + '/' + q.profile, () => row(4),
      (tr, q) => cells(tr, q.node, q.profile, clock(q.until_ms), q.reason));
    renderEvents();
  }
  function renderSummary(s, replicas) {
    const count = (xs, f) => {
      const m = new Map();
      for (const x of xs) m.set(f(x), (m.get(f(x)) || 0) + 1);
      return Array.from(m, ([k, v]) => v + ' ' + k).sort(natural).join(', ');
    };
    const total = s.nodes.reduce((a, n) => a + n.gpu_count, 0);
    const used = s.nodes.reduce((a, n) => a + usedOf(n), 0);
    const failed = s.nodes.reduce((a, n) => a + n.failed_gpus.length, 0);
    const chips = [
      ['nodes', plural(s.nodes.length, 'node') + (s.nodes.length ? ': ' : '')
        + count(s.nodes, (n) => n.state || 'unknown')],
      ['fabrics', plural(s.fabrics.length, 'fabric')],
      ['gpus', 'GPUs ' + used + ' / ' + total + ' in use, ' + failed + ' failed'],
      ['replicas', plural(replicas.length, 'replica') + (replicas.length ? ': ' : '')
        + count(replicas, (r) => r.state)],
    ];
    sync($('summary'), chips, (c) => c[0], () => el('span', 'chip'), (e, c) => setText(e, c[1]));
    const banners = [];
    if (s.mass_loss_hold) {
      banners.push('Mass-loss hold: most of the fleet fell silent at once; failing and reaping'
        + ' are held');
    }
    if (s.controller && s.controller.behind) banners.push('The controller is running behind');
    sync($('banners'), banners, (b) => b, () => el('div', 'banner'), (e, b) => setText(e, b));
  }
  function makeFabric() {
    const box = el('section', 'fabric');
    const h = el('h3');
    h.append(el('span', 'name'), ' ', el('span', 'muted meta'));
    const table = el('table');
    const head = row(7);
    head.replaceChildren(...['node', 'health', 'link', 'GPUs in use', 'failed', 'GPUs',
      'engines'].map((t) => el('th', '', t)));
    table.append(el('thead'), el('tbody'));
    table.tHead.appendChild(head);
    box.append(h, table);
    return box;
  }
  function updateFabric(box, f, members) {
    box.dataset.fabric = f.fabric;
    setText(box.querySelector('.name'), f.fabric);
    const total = members.reduce((a, n) => a + n.gpu_count, 0);
    const used = members.reduce((a, n) => a + usedOf(n), 0);
    setText(box.querySelector('.meta'), plural(members.length, 'node') + ', ' + used + ' / ' + total
      + ' GPUs in use');
    sync(box.querySelector('tbody'), members, (n) => n.node, makeNode, updateNode);
  }
  function makeNode() {
    const tr = row(7);
    tr.children[1].append(el('span'), el('span', 'flags'));
    tr.children[2].appendChild(el('span'));
    tr.children[5].appendChild(el('div', 'strip'));
    return tr;
  }
  function updateNode(tr, n) {
    const health = n.state || 'unknown';
    tr.dataset.node = n.node;
    tr.dataset.health = health;
    setText(tr.children[0], n.node);
    badge(tr.children[1].firstChild, 'health', health);
    const flags = ['cordoned', 'draining'].filter((flag) => n[flag] === true);
    setText(tr.children[1].lastChild, flags.map((flag) => ' ' + flag).join(''));
    // a suspect or lost node's link is the last value heard from it: shown as such, never green
    const link = n.fabric_link_up ? 'up' : 'down';
    if (n.stale === true) {
      badge(tr.children[2].firstChild, 'link', 'stale');
      setText(tr.children[2].firstChild, 'unknown (last heard ' + link + ')');
    } else badge(tr.children[2].firstChild, 'link', link);
    tr.dataset.link = n.stale === true ? 'stale' : link;
    setText(tr.children[3], usedOf(n) + ' / ' + n.gpu_count);
    setText(tr.children[4], n.failed_gpus.length);
    sync(tr.children[5].firstChild, n.gpus, (g) => g.index, () => el('span'), (e, g) => {
      const st = gpuState(n, g);
      setClass(e, 'gpu gpu-' + st);
      e.dataset.state = st;
      e.title = 'GPU ' + g.index + ': ' + (g.replica === null ? st
        : g.replica + ' rank ' + g.rank + (st === 'failed' ? ' (failed)' : ''));
    });
    setText(tr.children[6], (n.engines || []).join(', '));
  }
  function updateReplica(tr, r, nodes) {
    tr.dataset.replica = r.replica;
    tr.dataset.state = r.state;
    if (!tr.children[2].firstChild) tr.children[2].appendChild(el('span'));
    setText(tr.children[0], r.replica);
    setText(tr.children[1], r.model);
    const cut = r.state === 'ready' && r.routable === false; // out of routing, still ready
    setClass(tr.children[2].firstChild, 'badge state-' + (cut ? 'degraded' : r.state));
    setText(tr.children[2].firstChild, cut ? 'ready, unroutable' : r.state);
    setText(tr.children[3], r.fabric || '');
    setText(tr.children[4], (r.nodes || []).join(', '));
    const up = (r.shards || []).filter((x) => x.state === 'running' || x.state === 'serving');
    // shards on a node not heard from are counted as last heard, and marked so
    const unheard = (r.shards || []).filter((x) => (nodes.get(x.node) || {}).stale === true);
    setText(tr.children[5], (r.shards && r.shards.length ? up.length + ' / ' + r.shards.length
      : '') + (unheard.length ? ' (last heard: ' + unheard.map((x) => x.node).join(', ') + ')'
      : ''));
    setClass(tr.children[5], unheard.length ? 'shards-stale' : '');
    tr.dataset.stale = unheard.length ? 'true' : 'false';
    setClass(tr.children[6], 'reason');
    setText(tr.children[6], reasonOf(r));
  }
  function makePending() {
    const li = el('li');
    li.append(el('strong'), ' ', el('span', 'muted'), ': ', el('span', 'reason'));
    return li;
  }
  function updatePending(li, r) {
    li.dataset.replica = r.replica;
    const [name, model, why] = li.querySelectorAll('strong, span');
    setText(name, r.replica);
    setText(model, '(' + r.model + ')');
    setText(why, reasonOf(r) || 'waiting for a placement pass');
  }
  function renderEvents() {
    const shown = events.slice(-EVENTS_SHOWN).reverse();
    setText($('events-note'), '(newest first, the last ' + EVENTS_SHOWN + ' at most)');
    sync($('events'), shown, (ev) => ev.seq, () => {
      const li = el('li');
      li.append(el('span', 't'), el('span', 'k'), el('span', 's'));
      return li;
    }, (li, ev) => {
      li.dataset.kind = ev.kind;
      const subjects = Object.entries(ev.subjects).filter(([k]) => k !== 'argv')
        .map(([k, v]) => k + '=' + (Array.isArray(v) ? v.join(',') : v)).join(' ');
      setText(li.children[0], clock(ev.t_ms));
      setText(li.children[1], ev.kind);
      const cut = subjects.length > 400 ? subjects.slice(0, 400) + '\u2026' : subjects;
      setText(li.children[2], cut);
    });
  }

  // --- start ---------------------------------------------------------------------------------
  const given = fragmentToken();
  const saved = stored();
  if (given !== null) {
    if (TOKEN_RE.test(given)) useToken(given);
    else {
      showConn('auth', 'admin token needed', '');
      askToken('the token in the address is not a valid token');
    }
  } else if (saved !== null && TOKEN_RE.test(saved)) {
    useToken(saved);
  } else if (authRequired) {
    showConn('auth', 'admin token needed', '');
    askToken('');
  } else {
    showConn('wait', 'connecting', '');
    cycle();
  }
})();
"""
