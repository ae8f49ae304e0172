// deadletters.js -- callback rows in dlq with their last error; redeliver
// one, or redeliver by filter after the API's dry run has counted them
// (POST /v3/callbacks/redeliver: dry_run first, then the same filter for
// real).  Redelivery needs the operate role; without it nothing is offered.
import * as api from './api.js';
import { h, clear, when, shortId, table, confirmAction } from './dom.js';

export function render(main, ctx) {
  const operate = ctx.can('operate');
  const list = h('div', { id: 'dlq-list' });
  const status = h('span', { class: 'muted', id: 'dlq-status' });
  const cursors = [null];
  let page = 0;
  let stopped = false;

  async function redeliverOne(row) {
    const ok = await confirmAction({ title: `Redeliver callback ${row.id}?`, confirm: 'Redeliver',
      lines: [`A new callback row is made for request ${row.request_id} (${row.event_type}); this row stays as it is.`] });
    if (!ok) return;
    try {
      const res = await api.post(`/v3/callbacks/${row.id}/redeliver`);
      ctx.clearError();
      status.textContent = `Callback ${row.id} queued again as ${res.id}.`;
      await load();
    } catch (e) { ctx.showError(e); }
  }

  const columns = [
    { title: 'Id', cell: (r) => String(r.id) },
    { title: 'Request', cell: (r) => h('a', { href: `#/request/${r.request_id}`, class: 'mono' }, shortId(r.request_id)) },
    { title: 'Event', cell: (r) => r.event_type },
    { title: 'Attempts', cell: (r) => String(r.attempts) },
    { title: 'Last status', cell: (r) => (r.last_status === null ? '' : String(r.last_status)) },
    { title: 'Last error', cell: (r) => h('span', { class: 'error-text' }, r.last_error || '') },
    { title: 'Updated', cell: (r) => when(r.updated_at) },
  ];
  if (operate) {
    columns.push({ title: '', cell: (r) => (r.redelivered_as ? h('span', { class: 'muted' }, `redelivered as ${r.redelivered_as}`)
      : h('button', { type: 'button', 'data-action': 'redeliver', 'data-callback': r.id, onclick: () => redeliverOne(r) },
        'Redeliver')) });
  }

  async function load() {
    const doc = await api.get(`/v3/callbacks${api.query({ status: 'dlq', limit: 50, cursor: cursors[page] })}`);
    if (stopped) return;
    clear(list).append(doc.items.length === 0 ? h('p', { class: 'muted', id: 'dlq-empty' }, 'No dead letters.')
      : table(columns, doc.items, { id: 'dlq-table', class: 'list' }));
    const nav = h('div', { class: 'toolbar' });
    if (page > 0) nav.append(h('button', { type: 'button', onclick: () => { page -= 1; load().catch(ctx.showError); } }, '← Newer'));
    if (doc.next_cursor) {
      cursors[page + 1] = doc.next_cursor;
      nav.append(h('button', { type: 'button', onclick: () => { page += 1; load().catch(ctx.showError); } }, 'Older →'));
    }
    list.append(nav);
  }

  main.append(h('h1', {}, 'Dead letters'), status);
  if (operate) {
    const form = h('form', { id: 'bulk', class: 'filters card' },
      h('h2', {}, 'Redeliver by filter'),
      h('label', {}, 'Event type', h('input', { name: 'event_type', id: 'bulk-event', placeholder: 'any' })),
      h('label', {}, 'Request id', h('input', { name: 'request_id', id: 'bulk-request', placeholder: 'any', size: 36 })),
      h('button', { type: 'submit', id: 'bulk-count' }, 'Count matching…'));
    form.addEventListener('submit', async (e) => {
      e.preventDefault();
      const filter = {};
      for (const [k, v] of new FormData(form).entries()) if (String(v).trim()) filter[k] = String(v).trim();
      try {
        const dry = await api.post('/v3/callbacks/redeliver', { ...filter, dry_run: true });
        const ok = await confirmAction({ title: `Redeliver ${dry.count} dead letter(s)?`, confirm: `Redeliver ${dry.count}`,
          lines: [`${dry.count} dlq row(s) match${dry.capped ? ` (capped at ${dry.cap}; run it again for the rest)` : ''}.`,
            'Each gets a new callback row; rows already redelivered are left out.'] });
        if (!ok) return;
        const res = await api.post('/v3/callbacks/redeliver', { ...filter, dry_run: false });
        ctx.clearError();
        status.textContent = `${res.count} callback(s) queued again.`;
        await load();
      } catch (err) { ctx.showError(err); }
    });
    main.append(form);
  }
  main.append(list);
  load().catch(ctx.showError);
  return () => { stopped = true; };
}
