// health.js -- Workers and health: /readyz's checks, this process's worker
// registry (group, interval, last pass, errors, paused), every process's
// heartbeats for the class, and the signer roster (expected identity vs
// the one observed).  Refreshed every few seconds.
import * as api from './api.js';
import { h, clear, when, table, badge } from './dom.js';

const REFRESH_MS = 5000;

async function readiness() {
  try {
    return await api.get('/readyz');
  } catch (e) {
    if (e.status === 503 && e.problem && e.problem.checks) return e.problem;
    throw e;
  }
}

export function render(main, ctx) {
  const body = h('div', { id: 'health' });
  main.append(h('h1', {}, 'Workers and health'), body);
  let stopped = false;

  async function load() {
    const [ready, workers, beats, signers] = await Promise.all([readiness(), api.get('/v3/workers'),
      api.get('/v3/heartbeats'), api.get('/v3/signers')]);
    if (stopped) return;
    clear(body).append(
      h('section', { class: 'card', id: 'readiness' },
        h('h2', {}, 'Readiness ', badge(ready.ready ? 'READY' : 'NOT_READY')),
        table([{ title: 'Check', cell: (c) => c.name }, { title: 'Status', cell: (c) => badge(c.status.toUpperCase()) },
          { title: 'Detail', cell: (c) => c.detail }], ready.checks, { class: 'list' })),
      h('section', { class: 'card' }, h('h2', {}, 'Workers of this process'),
        table([
          { title: 'Worker', cell: (w) => w.name }, { title: 'Group', cell: (w) => w.group },
          { title: 'State', cell: (w) => badge(w.state.toUpperCase()) },
          { title: 'Interval', cell: (w) => `${w.interval} s` }, { title: 'Passes', cell: (w) => String(w.ticks) },
          { title: 'Last pass', cell: (w) => (w.last_tick_at ? when(w.last_tick_at * 1000) : 'never') },
          { title: 'Errors', cell: (w) => `${w.errors_total} (${w.consecutive_errors} in a row)` },
          { title: 'Last error', cell: (w) => h('span', { class: 'error-text' }, w.last_error || '') },
        ], workers.items, { id: 'workers-table', class: 'list' })),
      h('section', { class: 'card' }, h('h2', {}, `Heartbeats (stale after ${beats.stale_after_seconds} s)`),
        table([
          { title: 'Process', cell: (b) => b.process_id }, { title: 'Worker', cell: (b) => b.worker_name },
          { title: 'Group', cell: (b) => b.group_name }, { title: 'Last tick', cell: (b) => when(b.last_tick_at) || 'never' },
          { title: 'Errors in a row', cell: (b) => String(b.consecutive_errors) },
          { title: 'Updated', cell: (b) => [when(b.updated_at), b.stale ? h('b', { class: 'error-text' }, ' STALE') : ''] },
        ], beats.items, { id: 'heartbeats-table', class: 'list' })),
      h('section', { class: 'card' }, h('h2', {}, 'Signer identities'),
        signers.items.length === 0 ? h('p', { class: 'muted' }, 'No signer key is known for this class.')
          : table([
            { title: 'Key', cell: (s) => s.signer_key },
            { title: 'Expected', cell: (s) => h('span', { class: 'mono' }, s.expected_signer_address || '—') },
            { title: 'Observed', cell: (s) => h('span', { class: 'mono' }, s.observed_signer_address || '—') },
            { title: 'Posture', cell: (s) => badge(String(s.posture).toUpperCase()) },
            { title: 'Observed at', cell: (s) => when(s.observed_at) },
          ], signers.items, { id: 'signers-table', class: 'list' })));
  }
  const tick = () => load().catch((e) => { if (!stopped) ctx.showError(e); });
  const timer = setInterval(tick, REFRESH_MS);
  tick();
  return () => { stopped = true; clearInterval(timer); };
}
