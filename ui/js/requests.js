// requests.js -- the Requests page: filters (kept in the URL hash, so a
// filtered view can be shared), one page of GET /v3/requests at a time
// (keyset paging: next_cursor forward, a stack of cursors back), and a
// live refresh of the page shown.
import * as api from './api.js';
import { h, clear, badge, when, shortId, table } from './dom.js';

const STATES = ['PENDING_APPROVAL', 'APPROVED', 'EXECUTING', 'WAITING_MANUAL_ACTION', 'MANUAL_INTERVENTION',
  'COMPLETED', 'FAILED', 'REJECTED', 'CANCELLED', 'EXPIRED'];
// Age choices: minutes (older than / newer than).
const AGES = [['', 'any'], ['5', '5 min'], ['60', '1 hour'], ['1440', '1 day'], ['10080', '7 days']];
const TEXT_FILTERS = [
  ['asset', 'Asset', 'USDC'], ['amount_min', 'Amount ≥', '0'], ['amount_max', 'Amount ≤', ''],
  ['destination', 'Destination', '0x…'], ['error_code', 'Error code', ''],
];
const REFRESH_MS = 5000;

function select(name, options, value) {
  return h('select', { name, id: `f-${name}` },
    options.map(([v, label]) => h('option', { value: v, selected: v === value }, label)));
}

function minutesAgo(m) {
  return m ? new Date(Date.now() - Number(m) * 60000).toISOString() : '';
}

export function render(main, ctx) {
  const p = ctx.params;
  const filters = {};
  for (const k of ['state', 'template_key', 'older_than', 'newer_than', ...TEXT_FILTERS.map((f) => f[0])]) {
    filters[k] = p.get(k) || '';
  }
  const templateSelect = select('template_key', [['', 'any']], filters.template_key);
  const form = h('form', { id: 'filters', class: 'filters' },
    h('label', {}, 'State', select('state', [['', 'any'], ...STATES.map((s) => [s, s])], filters.state)),
    h('label', {}, 'Template', templateSelect),
    h('label', {}, 'Older than', select('older_than', AGES, filters.older_than)),
    h('label', {}, 'Newer than', select('newer_than', AGES, filters.newer_than)),
    TEXT_FILTERS.map(([k, label, ph]) => h('label', {}, label,
      h('input', { name: k, id: `f-${k}`, value: filters[k], placeholder: ph, size: k === 'destination' ? 24 : 10 }))),
    h('button', { type: 'submit', id: 'apply' }, 'Apply'),
    h('button', { type: 'button', id: 'reset', onclick: () => { location.hash = '#/requests'; } }, 'Reset'));
  form.addEventListener('submit', (e) => {
    e.preventDefault();
    const q = {};
    for (const [k, v] of new FormData(form).entries()) if (String(v).trim()) q[k] = String(v).trim();
    location.hash = `#/requests${api.query(q)}`;
  });

  const live = h('input', { type: 'checkbox', id: 'live', checked: true });
  const status = h('span', { class: 'muted', id: 'list-status' });
  const body = h('div', { id: 'request-list' });
  const prev = h('button', { type: 'button', id: 'prev' }, '← Newer');
  const next = h('button', { type: 'button', id: 'next' }, 'Older →');
  main.append(h('h1', {}, 'Requests'), form,
    h('div', { class: 'toolbar' }, prev, next, h('label', {}, live, ' live refresh'), status), body);

  api.get('/v3/templates').then((doc) => {
    for (const t of doc.items) {
      templateSelect.append(h('option', { value: t.template_key, selected: t.template_key === filters.template_key },
        t.template_key));
    }
  }).catch(ctx.showError);

  const base = {
    state: filters.state, template_key: filters.template_key, asset: filters.asset,
    amount_min: filters.amount_min, amount_max: filters.amount_max, destination: filters.destination,
    error_code: filters.error_code, limit: 50,
  };
  // age filters are fixed when the page opens, so paging stays consistent
  base.created_before = minutesAgo(filters.older_than);
  base.created_after = minutesAgo(filters.newer_than);

  const cursors = [null];   // cursors[i]: the cursor of page i (null: the first)
  let page = 0;
  let nextCursor = null;
  let stopped = false;

  async function load() {
    try {
      const doc = await api.get(`/v3/requests${api.query({ ...base, cursor: cursors[page] })}`);
      if (stopped) return;
      ctx.clearError();
      nextCursor = doc.next_cursor;
      prev.disabled = page === 0;
      next.disabled = !nextCursor;
      status.textContent = `page ${page + 1} · ${doc.items.length} shown · updated ${new Date().toLocaleTimeString()}`;
      clear(body).append(doc.items.length === 0 ? h('p', { class: 'muted', id: 'no-rows' }, 'No request matches.')
        : table(columns, doc.items, { id: 'requests-table', class: 'list' }));
    } catch (e) {
      if (!stopped) ctx.showError(e);
    }
  }
  next.addEventListener('click', () => { if (nextCursor) { cursors[page + 1] = nextCursor; page += 1; load(); } });
  prev.addEventListener('click', () => { if (page > 0) { page -= 1; load(); } });

  const timer = setInterval(() => { if (live.checked) load(); }, REFRESH_MS);
  load();
  return () => { stopped = true; clearInterval(timer); };
}

const intent = (r, k) => (r.intent && r.intent[k] !== undefined ? String(r.intent[k]) : '');

const columns = [
  { title: 'Created', cell: (r) => when(r.created_at) },
  { title: 'Request', cell: (r) => h('a', { href: `#/request/${r.id}`, class: 'mono', 'data-id': r.id }, shortId(r.id)) },
  { title: 'Template', cell: (r) => r.template_key },
  { title: 'State', cell: (r) => badge(r.request_state) },
  { title: 'Asset', cell: (r) => intent(r, 'asset') },
  { title: 'Amount', cell: (r) => h('span', { class: 'num' }, intent(r, 'amount')) },
  { title: 'Destination', cell: (r) => h('span', { class: 'mono' }, intent(r, 'destination')) },
  { title: 'Error', cell: (r) => r.last_error_code || '' },
  { title: 'By', cell: (r) => r.created_by },
];
