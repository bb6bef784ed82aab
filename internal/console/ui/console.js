// outboxrelay console. Plain JavaScript, no framework, nothing fetched but
// the relay's own management API (the page's Content-Security-Policy
// allows nothing else). Text from the relay is always set as text, never
// as HTML, so a payload can never become markup.
'use strict';

(function () {
  const API = new URL('../api/v1/', document.baseURI).pathname;
  const REFRESH_MS = 5000;
  const COLORS = ['#0b5cad', '#b42318', '#1a7f37', '#8250df', '#9a6700', '#0a7ea4', '#bf3989', '#57606a'];
  const SVGNS = 'http://www.w3.org/2000/svg';

  const state = {
    session: { signed_in: false, actions: false, actions_enabled: false, read_token_required: false },
    pipelines: [],
    history: {},
    dlPipeline: '',
    letter: null,
    readBlocked: false,
  };

  const $ = (id) => document.getElementById(id);

  // el builds an element with text content and attributes.
  function el(tag, attrs, ...children) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === undefined || v === null || v === false) continue;
      if (k === 'text') e.textContent = v;
      else if (k === 'class') e.className = v;
      else if (k.startsWith('on')) e.addEventListener(k.slice(2), v);
      else e.setAttribute(k, v === true ? '' : v);
    }
    for (const c of children) {
      if (c === null || c === undefined) continue;
      e.append(c instanceof Node ? c : document.createTextNode(String(c)));
    }
    return e;
  }

  function svg(tag, attrs) {
    const e = document.createElementNS(SVGNS, tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (k === 'text') e.textContent = v;
      else e.setAttribute(k, v);
    }
    return e;
  }

  // api calls the management API. Every request that changes something
  // carries the session's CSRF token; the session cookie goes by itself.
  async function api(method, path, body) {
    const headers = { Accept: 'application/json' };
    if (method !== 'GET') {
      headers['X-Actor'] = 'console';
      if (state.session.csrf_token) headers['X-CSRF-Token'] = state.session.csrf_token;
    }
    const opts = { method, headers, credentials: 'same-origin', cache: 'no-store' };
    if (body !== undefined) {
      headers['Content-Type'] = 'application/json';
      opts.body = JSON.stringify(body);
    }
    let resp;
    try {
      resp = await fetch(API + path, opts);
    } catch (err) {
      return { status: 0, ok: false, data: { error: 'the relay did not answer: ' + err.message } };
    }
    const text = await resp.text();
    let data;
    try {
      data = JSON.parse(text);
    } catch (_) {
      data = { error: text.trim() };
    }
    return { status: resp.status, ok: resp.ok, data };
  }

  function notice(text, kind) {
    const n = $('notice');
    n.textContent = text;
    n.className = 'notice' + (kind ? ' ' + kind : '');
  }

  // Formatting. A figure the relay does not know is null and shows "—".
  function fmtSeconds(s) {
    if (s === null || s === undefined) return '—';
    if (s < 1) return s.toFixed(2) + ' s';
    if (s < 60) return s.toFixed(1) + ' s';
    if (s < 3600) return (s / 60).toFixed(1) + ' min';
    return (s / 3600).toFixed(1) + ' h';
  }
  // fmtTick labels the chart's axis with as few digits as its scale needs.
  function fmtTick(v, top) {
    if (v === 0) return '0';
    if (top >= 7200) return (v / 3600).toFixed(1) + ' h';
    if (top >= 120) return (v / 60).toFixed(top >= 600 ? 0 : 1) + ' min';
    return Number(v.toFixed(2)) + ' s';
  }
  function fmtBytes(b) {
    if (b === null || b === undefined) return '—';
    const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
    let i = 0;
    let v = b;
    while (v >= 1024 && i < units.length - 1) {
      v /= 1024;
      i++;
    }
    return (i === 0 ? String(v) : v.toFixed(1)) + ' ' + units[i];
  }
  function fmtRate(r) {
    if (r === null || r === undefined) return '—';
    return (r < 10 ? r.toFixed(1) : Math.round(r).toLocaleString('en')) + ' msg/s';
  }
  // fmtTime writes a time in the browser's zone as 2026-12-02 19:06:17.
  function fmtTime(t) {
    if (!t || t.startsWith('0001-')) return '—';
    const d = new Date(t);
    const two = (n) => String(n).padStart(2, '0');
    return d.getFullYear() + '-' + two(d.getMonth() + 1) + '-' + two(d.getDate()) + ' ' +
      two(d.getHours()) + ':' + two(d.getMinutes()) + ':' + two(d.getSeconds());
  }

  // --- session -------------------------------------------------------

  async function loadSession() {
    const r = await api('GET', 'session');
    if (r.ok) state.session = r.data;
    renderSession();
  }

  function renderSession() {
    const s = state.session;
    const canSignIn = s.actions_enabled || s.read_token_required;
    $('signin').hidden = s.signed_in || !canSignIn;
    $('session').hidden = !s.signed_in && canSignIn;
    $('signout').hidden = !s.signed_in;
    if (s.signed_in) {
      $('session-text').textContent = s.actions ? 'Signed in: may pause, resume, replay and purge' : 'Signed in with the read token: read only';
    } else if (!canSignIn) {
      $('session-text').textContent = 'Read only: actions are off (http.action_token is not set)';
    }
    for (const b of document.querySelectorAll('[data-action]')) b.disabled = !canAct();
    $('dl-purge-all').disabled = !canAct() || !state.dlLetters || state.dlLetters.length === 0;
  }

  function canAct() {
    return state.session.signed_in && state.session.actions;
  }

  async function signIn(ev) {
    ev.preventDefault();
    const input = $('token');
    const r = await api('POST', 'session', { token: input.value });
    input.value = '';
    if (!r.ok) {
      notice('Sign-in refused: ' + r.data.error, 'error');
      input.focus();
      return;
    }
    state.session = r.data;
    notice(r.data.actions ? 'Signed in.' : 'Signed in with the read token: read only.', 'ok');
    renderSession();
    $('signout').focus();
    refresh();
  }

  async function signOut() {
    const r = await api('DELETE', 'session');
    if (!r.ok) {
      notice('Sign-out failed: ' + r.data.error, 'error');
      return;
    }
    state.session = r.data;
    notice('Signed out.', 'ok');
    renderSession();
    $('token').focus();
  }

  // --- pipelines -----------------------------------------------------

  async function refresh() {
    const [p, h] = await Promise.all([api('GET', 'pipelines'), api('GET', 'history')]);
    if (p.status === 401) {
      state.readBlocked = true;
      notice('This relay requires a token to read (http.token): sign in.', 'error');
      return;
    }
    if (!p.ok) {
      notice('Could not read the pipelines: ' + p.data.error, 'error');
      return;
    }
    if (state.readBlocked) {
      state.readBlocked = false;
      notice('');
    }
    state.pipelines = p.data.pipelines || [];
    if (h.ok) {
      state.history = {};
      for (const ph of h.data.pipelines || []) state.history[ph.name] = ph.samples || [];
      state.historySpan = h.data.span_seconds || 3600;
    }
    renderPipelines();
    renderChart();
    renderPipelineSelect();
    $('updated').textContent = 'updated ' + new Date().toLocaleTimeString('en-GB', { hour12: false });
  }

  function lastRate(name) {
    const samples = state.history[name] || [];
    for (let i = samples.length - 1; i >= 0; i--) {
      if (samples[i].published_per_second !== null && samples[i].published_per_second !== undefined) {
        return samples[i].published_per_second;
      }
      if (samples.length - i > 3) break; // too old to call current
    }
    return null;
  }

  // labelCells gives each body cell of table its column's heading as
  // data-label, which the narrow layout (console.css, .cards) shows beside
  // the figure once the table is laid out as one card per row.
  function labelCells(table) {
    const heads = Array.from(table.tHead.rows[0].cells, (c) => c.textContent.trim());
    for (const row of table.tBodies[0].rows) {
      Array.from(row.cells).forEach((c, i) => {
        if (heads[i] && !c.dataset.label) c.dataset.label = heads[i];
      });
    }
  }

  // renderPipelines updates the table in place: a row, and its button,
  // stay the same elements across refreshes, so the keyboard focus and a
  // pointer on its way to a button are never lost to a redraw.
  function renderPipelines() {
    const body = $('pipelines').tBodies[0];
    const rows = new Map(Array.from(body.rows).map((r) => [r.dataset.pipeline, r]));
    const names = new Set(state.pipelines.map((p) => p.name));
    for (const [name, row] of rows) if (!names.has(name)) row.remove();
    for (const p of state.pipelines) {
      let row = rows.get(p.name);
      if (!row) {
        row = el('tr', { 'data-pipeline': p.name },
          el('th', { scope: 'row', text: p.name }),
          el('td', { 'data-field': 'state' }),
          el('td', { class: 'num', 'data-field': 'lag_seconds' }),
          el('td', { class: 'num', 'data-field': 'lag_bytes' }),
          el('td', { class: 'num', 'data-field': 'retained_wal_bytes' }),
          el('td', { class: 'num', 'data-field': 'throughput' }),
          el('td', { class: 'num', 'data-field': 'dead_letters' }),
          el('td', { class: 'num', 'data-field': 'republished_total' }),
          el('td', { 'data-field': 'action' },
            el('button', { type: 'button', 'data-action': 'pause', onclick: (ev) => pauseResume(p.name, ev.currentTarget.dataset.action) })));
      }
      if (!rows.has(p.name)) body.append(row); // a pipeline's row is moved never: a moved node is a new one to a driver
      const slot = p.slot || {};
      const paused = p.state === 'paused';
      const cell = (f) => row.querySelector('[data-field="' + f + '"]');
      const why = p.error || (!p.ready && !paused ? p.not_ready : '') || p.status_error;
      cell('state').replaceChildren(el('span', { class: 'state state-' + p.state, text: p.state }));
      if (why) cell('state').append(el('span', { class: 'why', text: why }));
      cell('lag_seconds').textContent = fmtSeconds(slot.lag_seconds);
      cell('lag_bytes').textContent = fmtBytes(slot.lag_bytes);
      cell('retained_wal_bytes').textContent = fmtBytes(slot.retained_wal_bytes);
      cell('throughput').textContent = fmtRate(lastRate(p.name));
      cell('dead_letters').textContent = slot.dead_letters === undefined || slot.dead_letters === null ? '—' : String(slot.dead_letters);
      // Messages published again while the broker may have held them (status republished_total), with the reasons.
      cell('republished_total').textContent = slot.republished_total === undefined || slot.republished_total === null ? '—' : String(slot.republished_total);
      cell('republished_total').title = Object.entries(slot.republished || {}).map(([r, n]) => r + ' ' + n).join(', ');
      const button = cell('action').firstChild;
      const what = paused ? 'resume' : 'pause';
      const label = paused ? 'Resume' : 'Pause';
      button.dataset.action = what;
      button.dataset.key = what + ':' + p.name;
      button.textContent = label;
      button.setAttribute('aria-label', label + ' pipeline ' + p.name);
      button.disabled = !canAct();
    }
    labelCells($('pipelines'));
  }

  async function pauseResume(name, what) {
    const verb = what === 'pause' ? 'Pause' : 'Resume';
    const text = what === 'pause'
      ? 'Pause pipeline ' + name + '? It stops reading, drains what is in flight and confirms its position; rows committed meanwhile wait in its slot.'
      : 'Resume pipeline ' + name + '? It starts again from its confirmed position.';
    if (!(await confirmAction(verb + ' pipeline', text, verb))) return;
    notice((what === 'pause' ? 'Pausing ' : 'Resuming ') + name + '…');
    const r = await api('POST', 'pipelines/' + encodeURIComponent(name) + '/' + what);
    if (r.ok) {
      notice('Pipeline ' + name + ' is ' + r.data.state + (r.data.note ? ' (' + r.data.note + ')' : '') + '.', 'ok');
    } else {
      notice(verb + ' ' + name + ' refused (' + r.status + '): ' + r.data.error, 'error');
    }
    await refresh();
  }

  // --- chart ---------------------------------------------------------

  // niceScale is the chart's top and how many gridlines split it into
  // round steps.
  const STEPS = [[1, 4], [1.5, 3], [2, 4], [2.5, 5], [3, 3], [4, 4], [5, 5], [6, 3], [8, 4], [10, 5]];
  function niceScale(v) {
    if (v <= 1) return [1, 4];
    const p = Math.pow(10, Math.floor(Math.log10(v)));
    for (const [m, n] of STEPS) if (m * p >= v) return [m * p, n];
    return [10 * p, 5];
  }

  function renderChart() {
    const W = 900, H = 200, L = 56, R = 14, T = 10, B = 26;
    const span = (state.historySpan || 3600) * 1000;
    const now = Date.now();
    let top = 0;
    for (const name of Object.keys(state.history)) {
      for (const s of state.history[name]) if (s.lag_seconds !== null && s.lag_seconds > top) top = s.lag_seconds;
    }
    const [scaled, divisions] = niceScale(top * 1.1);
    top = scaled;
    const x = (t) => L + ((t - (now - span)) / span) * (W - L - R);
    const y = (v) => T + (1 - v / top) * (H - T - B);
    const root = svg('svg', { viewBox: '0 0 ' + W + ' ' + H, role: 'img', 'aria-labelledby': 'chart-title chart-desc' });
    root.append(svg('title', { id: 'chart-title', text: 'Lag in seconds, each pipeline, over the last hour' }));
    const desc = [];
    for (let i = 0; i <= divisions; i++) {
      const v = (top * i) / divisions;
      root.append(svg('line', { class: 'axis', x1: L, x2: W - R, y1: y(v), y2: y(v) }));
      root.append(svg('text', { x: L - 6, y: y(v) + 4, 'text-anchor': 'end', text: fmtTick(v, top) }));
    }
    for (let m = 60; m >= 0; m -= 15) {
      const t = now - m * 60000;
      root.append(svg('text', { x: x(t), y: H - 8, 'text-anchor': m === 0 ? 'end' : m === 60 ? 'start' : 'middle', text: m === 0 ? 'now' : '−' + m + ' min' }));
    }
    const legend = $('legend');
    legend.replaceChildren();
    state.pipelines.forEach((p, i) => {
      const color = COLORS[i % COLORS.length];
      const samples = state.history[p.name] || [];
      let d = '';
      let pen = 'M';
      let last = null;
      for (const s of samples) {
        const t = Date.parse(s.at);
        if (s.lag_seconds === null || t < now - span) {
          pen = 'M'; // a gap: the figure was not known
          continue;
        }
        d += pen + x(t).toFixed(1) + ' ' + y(s.lag_seconds).toFixed(1) + ' ';
        pen = 'L';
        last = s.lag_seconds;
      }
      if (d) root.append(svg('path', { d, fill: 'none', stroke: color, 'stroke-width': 2, 'stroke-linejoin': 'round', 'data-pipeline': p.name }));
      const sw = svg('svg', { width: 20, height: 6, 'aria-hidden': 'true' });
      sw.append(svg('line', { x1: 0, x2: 20, y1: 3, y2: 3, stroke: color, 'stroke-width': 4 }));
      legend.append(el('li', {}, sw, p.name + ': ' + fmtSeconds(last) + ' now'));
      desc.push(p.name + ' ' + fmtSeconds(last));
    });
    root.append(svg('desc', { id: 'chart-desc', text: 'Current lag: ' + (desc.join(', ') || 'no samples yet') }));
    $('chart').replaceChildren(root);
  }

  // --- dead letters --------------------------------------------------

  function renderPipelineSelect() {
    const sel = $('dl-pipeline');
    const names = state.pipelines.map((p) => p.name);
    const have = Array.from(sel.options).map((o) => o.value);
    if (names.join('\n') !== have.join('\n')) {
      sel.replaceChildren(...names.map((n) => el('option', { value: n, text: n })));
      if (!names.includes(state.dlPipeline)) state.dlPipeline = names[0] || '';
      sel.value = state.dlPipeline;
      loadLetters();
    }
  }

  async function loadLetters() {
    const name = state.dlPipeline;
    if (!name) return;
    const all = $('dl-all').checked ? '?all=true' : '';
    const r = await api('GET', 'pipelines/' + encodeURIComponent(name) + '/dead-letters' + all);
    const body = $('letters').tBodies[0];
    body.replaceChildren();
    state.dlLetters = [];
    if (!r.ok) {
      $('letters-empty').hidden = false;
      $('letters-empty').textContent = 'Dead letters of ' + name + ' cannot be read: ' + r.data.error;
      renderSession();
      return;
    }
    state.dlLetters = r.data.dead_letters || [];
    $('letters-empty').hidden = state.dlLetters.length > 0;
    $('letters-empty').textContent = 'No dead letters in pipeline ' + name + '.';
    for (const l of state.dlLetters) {
      body.append(el('tr', { 'data-letter': l.id, class: state.letter && state.letter.id === l.id ? 'selected' : '' },
        el('td', { class: 'num', text: l.id }),
        el('td', { class: 'mono', text: l.message_id }),
        el('td', { text: l.aggregate_type + ' / ' + l.aggregate_id }),
        el('td', { text: l.event_type }),
        el('td', { class: 'mono', text: l.destination }),
        el('td', { class: 'num', text: l.attempts }),
        el('td', { class: 'error-cell', text: l.error }),
        el('td', { class: 'num', text: (l.parked || []).length }),
        el('td', {}, el('button', { type: 'button', 'data-key': 'open:' + l.id, 'aria-label': 'Open dead letter ' + l.id, text: 'Open', onclick: () => openLetter(l.id) }))));
    }
    labelCells($('letters'));
    renderSession();
  }

  function prettyJSON(text) {
    try {
      return JSON.stringify(JSON.parse(text), null, 2);
    } catch (_) {
      return text;
    }
  }

  async function openLetter(id) {
    const name = state.dlPipeline;
    const r = await api('GET', 'pipelines/' + encodeURIComponent(name) + '/dead-letters/' + id);
    if (!r.ok) {
      notice('Could not open dead letter ' + id + ': ' + r.data.error, 'error');
      return;
    }
    const l = r.data;
    state.letter = l;
    $('letter-h').textContent = 'Dead letter ' + l.id + ' of pipeline ' + name;
    const fields = $('letter-fields');
    fields.replaceChildren();
    const add = (k, v) => fields.append(el('dt', { text: k }), el('dd', { text: v }));
    add('Message id', l.message_id);
    add('Aggregate', l.aggregate_type + ' / ' + l.aggregate_id);
    add('Event type', l.event_type);
    add('Destination', l.destination);
    add('Attempts', String(l.attempts));
    add('First failed', fmtTime(l.first_failed_at));
    add('Last failed', fmtTime(l.last_failed_at));
    add('Replayed', l.replayed_at ? fmtTime(l.replayed_at) : 'not yet');
    add('Parks its aggregate', l.parks ? 'yes: later messages wait behind it' : 'no');
    $('letter-error').textContent = l.error;
    $('letter-envelope').textContent = prettyJSON(l.envelope);
    const chain = l.parked || [];
    $('letter-chain-box').hidden = chain.length === 0;
    const cb = $('letter-chain').tBodies[0];
    cb.replaceChildren(...chain.map((p, i) => el('tr', {},
      el('td', { class: 'num', text: i + 1 }),
      el('td', { class: 'mono', text: p.message_id }),
      el('td', { text: p.event_type }),
      el('td', { text: fmtTime(p.committed_at) }),
      el('td', {}, el('pre', { text: p.envelope ? prettyJSON(p.envelope) : '(binary body)' })))));
    $('letter-replay').disabled = !canAct() || (l.replayed_at && chain.length === 0);
    $('letter-purge').disabled = !canAct();
    $('letter-replay').setAttribute('data-action', 'replay');
    $('letter-purge').setAttribute('data-action', 'purge');
    $('letter').hidden = false;
    for (const tr of $('letters').tBodies[0].rows) tr.classList.toggle('selected', tr.dataset.letter === String(l.id));
    $('letter').focus();
  }

  function closeLetter() {
    const id = state.letter && state.letter.id;
    state.letter = null;
    $('letter').hidden = true;
    const back = id && document.querySelector('[data-key="open:' + id + '"]');
    if (back) back.focus();
  }

  async function replayLetter() {
    const l = state.letter;
    const name = state.dlPipeline;
    const chain = (l.parked || []).length;
    const text = 'Publish dead letter ' + l.id + ' (message ' + l.message_id + ') to ' + l.destination +
      (chain ? ', then the ' + chain + ' message' + (chain === 1 ? '' : 's') + ' parked behind it, in order' : '') + '?';
    if (!(await confirmAction('Replay dead letter ' + l.id, text, 'Replay'))) return;
    notice('Replaying dead letter ' + l.id + '…');
    const r = await api('POST', 'pipelines/' + encodeURIComponent(name) + '/dead-letters/' + l.id + '/replay');
    if (r.ok) {
      notice('Replayed dead letter ' + l.id + ': ' + r.data.letters + ' letter and ' + r.data.parked + ' parked published.', 'ok');
      $('letter').hidden = true;
      state.letter = null;
    } else {
      notice('Replay of dead letter ' + l.id + ' failed (' + r.status + '): ' + r.data.error, 'error');
    }
    await loadLetters();
    await refresh();
  }

  async function purgeLetter() {
    const l = state.letter;
    const name = state.dlPipeline;
    const chain = (l.parked || []).length;
    const text = 'Delete dead letter ' + l.id + (chain ? ' and the ' + chain + ' message' + (chain === 1 ? '' : 's') + ' parked behind it' : '') +
      '? They will not be delivered; the aggregate\'s next messages flow again.';
    if (!(await confirmAction('Purge dead letter ' + l.id, text, 'Purge'))) return;
    const r = await api('POST', 'pipelines/' + encodeURIComponent(name) + '/dead-letters/' + l.id + '/purge');
    if (r.ok) {
      notice('Purged dead letter ' + l.id + ' (' + r.data.parked + ' parked).', 'ok');
      $('letter').hidden = true;
      state.letter = null;
    } else {
      notice('Purge of dead letter ' + l.id + ' failed (' + r.status + '): ' + r.data.error, 'error');
    }
    await loadLetters();
    await refresh();
  }

  async function purgeAll() {
    const name = state.dlPipeline;
    const before = new Date(Date.now() + 1000).toISOString();
    const text = 'Delete every dead letter of pipeline ' + name + ' created before ' + fmtTime(before) +
      ', with the chains parked behind them? They will not be delivered.';
    if (!(await confirmAction('Purge all dead letters of ' + name, text, 'Purge all'))) return;
    const r = await api('POST', 'pipelines/' + encodeURIComponent(name) + '/dead-letters/purge?before=' + encodeURIComponent(before.replace(/\.\d+Z$/, 'Z')));
    if (r.ok) notice('Purged ' + r.data.letters + ' dead letters and ' + r.data.parked + ' parked messages of ' + name + '.', 'ok');
    else notice('Purge failed (' + r.status + '): ' + r.data.error, 'error');
    $('letter').hidden = true;
    state.letter = null;
    await loadLetters();
    await refresh();
  }

  // confirmAction asks in a modal dialog; it resolves true on Confirm,
  // false on Cancel or Escape, and gives the focus back where it was.
  function confirmAction(title, text, verb) {
    const dlg = $('confirm');
    const back = document.activeElement;
    $('confirm-h').textContent = title;
    $('confirm-text').textContent = text;
    $('confirm-ok').textContent = verb;
    return new Promise((resolve) => {
      const done = (ok) => {
        $('confirm-ok').onclick = null;
        $('confirm-cancel').onclick = null;
        dlg.onclose = null;
        if (dlg.open) dlg.close();
        if (back && back.isConnected) back.focus();
        resolve(ok);
      };
      $('confirm-ok').onclick = () => done(true);
      $('confirm-cancel').onclick = () => done(false);
      dlg.onclose = () => done(false);
      dlg.showModal();
      $('confirm-cancel').focus();
    });
  }

  function start() {
    $('signin').addEventListener('submit', signIn);
    $('signout').addEventListener('click', signOut);
    $('dl-pipeline').addEventListener('change', (ev) => {
      state.dlPipeline = ev.target.value;
      $('letter').hidden = true;
      state.letter = null;
      loadLetters();
    });
    $('dl-all').addEventListener('change', loadLetters);
    $('dl-refresh').addEventListener('click', loadLetters);
    $('dl-purge-all').addEventListener('click', purgeAll);
    $('letter-replay').addEventListener('click', replayLetter);
    $('letter-purge').addEventListener('click', purgeLetter);
    $('letter-close').addEventListener('click', closeLetter);
    loadSession().then(refresh);
    setInterval(refresh, REFRESH_MS);
  }

  start();
})();
