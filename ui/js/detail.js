// detail.js -- one request: its legal actions, the "why is it waiting"
// panel, the DAG, the nodes (attempts, provider refs, errors), the
// approvals, the intent, and the audit timeline (GET .../events, paged).
// Refreshed every few seconds while the request is not terminal.
import * as api from './api.js';
import { h, clear, badge, when, json, table, printable } from './dom.js';
import { drawDag } from './dag.js';
import { requestActions, nodeActions, run, stopping } from './actions.js';

const TERMINAL = ['COMPLETED', 'REJECTED', 'CANCELLED', 'EXPIRED'];
const IN_FLIGHT = ['SUBMITTING', 'SUBMITTED', 'OBSERVING'];

// unknownRun(n) -> a clause naming a run of observations that ended UNKNOWN
// (the executor's observe() fails while recovery finds the node in flight).
function unknownRun(n) {
  const k = n.unknown_observations || 0;
  return k > 0 ? `; its last ${k} observation${k === 1 ? '' : 's'} in a row ended UNKNOWN` : '';
}
const REFRESH_MS = 4000;

// whyWaiting(req, workers) -> lines saying what the request waits for.
export function whyWaiting(req, workers) {
  const lines = [];
  const st = req.request_state;
  const pol = req.approval_policy || {};
  if (TERMINAL.includes(st)) {
    lines.push(`Finished: ${st}${req.finished_at ? ` at ${when(req.finished_at)}` : ''}.`);
    return lines;
  }
  if (st === 'PENDING_APPROVAL' && req.initiation_statement && !req.initiated) {
    lines.push(`Waits for its maker ${req.created_by} to sign its initiation statement; no approval is taken before.`);
  }
  if (st === 'PENDING_APPROVAL') {
    const approved = (req.approvals || []).filter((a) => a.decision === 'approve').map((a) => a.principal);
    lines.push(`Waits for ${pol.still_needed} more approval(s) of ${req.approvals_required}`
      + `${pol.rule ? ` (policy rule ${pol.rule}` : ''}${pol.roles && pol.roles.length ? `, role ${pol.roles.join(' or ')}` : ''}`
      + `${pol.rule ? ')' : ''}; not from ${req.created_by}, who created it.`);
    if (approved.length) lines.push(`Approved so far by ${approved.join(', ')}.`);
    if (pol.error) lines.push(`The approval policy failed: ${pol.error}`);
    if (req.expires_at) lines.push(`The approval window closes ${when(req.expires_at)}.`);
  }
  if (st === 'APPROVED') lines.push('Approved; waits for the dispatcher to start its first node.');
  if (st === 'MANUAL_INTERVENTION') {
    lines.push(`Stopped for an operator: ${req.last_error_code || 'see the node errors'}. Fix the cause, then retry the node or resume.`);
  }
  if (st === 'FAILED') lines.push(`Failed: ${req.last_error_code || 'see the node errors'}; a node may be retried.`);
  const held = st === 'EXECUTING' && stopping(req);
  if (held) {
    lines.push('Stopping: it waits for its nodes in flight (or UNKNOWN) to settle, then ends FAILED, or'
      + ' MANUAL_INTERVENTION if money moved; no other node starts. Retry the failed node to go on instead.');
  }
  for (const n of req.nodes || []) {
    if (held && n.node_state === 'READY') {
      lines.push(`Node ${n.node_key} is ready but does not start while the request is stopping.`);
    } else if (n.node_kind === 'manual' && n.node_state === 'READY') {
      lines.push(`Manual step ${n.node_key} waits for an operator to complete it`
        + `${n.manual && n.manual.attestation_statement ? ', who signs that it is done' : ''}.`);
    } else if (n.node_state === 'READY') {
      lines.push(`Node ${n.node_key} is ready; the next dispatcher pass submits it.`);
    } else if (IN_FLIGHT.includes(n.node_state)) {
      lines.push(`Node ${n.node_key} is ${n.node_state}${n.next_observe_at
        ? `; next observation ${when(n.next_observe_at)} (observed ${n.observe_count} times)` : ''}`
        + `${unknownRun(n)}.`);
    } else if (n.node_state === 'UNKNOWN') {
      lines.push(`Node ${n.node_key}: outcome unknown${n.error_code ? ` (${n.error_code})` : ''}`
        + `${n.state_since ? ` since ${when(n.state_since)}` : ''}`
        + `${n.next_observe_at ? `; checked again ${when(n.next_observe_at)}` : '; needs a retry or resolution'}`
        + `${unknownRun(n)}.`);
    } else if (n.node_state === 'FAILED') {
      lines.push(`Node ${n.node_key} failed after attempt ${n.attempt_no}: ${n.error_code || ''} ${n.error_detail || ''}`
        + `${n.next_observe_at ? `; backoff until ${when(n.next_observe_at)}` : ''}.`);
    }
  }
  for (const w of workers || []) {
    if (w.paused || w.state === 'paused') lines.push(`Worker ${w.name} is paused in this process.`);
    else if (w.state === 'dead' || w.state === 'stopped') lines.push(`Worker ${w.name} is ${w.state}.`);
    else if (w.consecutive_errors > 0) lines.push(`Worker ${w.name} failed its last ${w.consecutive_errors} pass(es): ${w.last_error || ''}`);
  }
  if (lines.length === 0) lines.push('Nothing blocks it; the workers move it on their next passes.');
  return lines;
}

function kv(pairs) {
  return h('dl', { class: 'kv' }, pairs.map(([k, v]) => [h('dt', {}, k), h('dd', {}, v)]));
}

function flat(obj, prefix = '') {
  const out = [];
  for (const [k, v] of Object.entries(obj || {})) {
    if (v && typeof v === 'object' && !Array.isArray(v)) out.push(...flat(v, `${prefix}${k}.`));
    else out.push([printable(`${prefix}${k}`), printable(typeof v === 'string' ? v : JSON.stringify(v))]);
  }
  return out;
}

export function render(main, ctx) {
  const id = ctx.args[0];
  let stopped = false;
  let timer = null;
  const events = h('div', { id: 'timeline' });
  let eventsCursor = null;

  async function loadEvents(more) {
    const doc = await api.get(`/v3/requests/${id}/events${api.query({ limit: 100, cursor: more ? eventsCursor : null })}`);
    if (!more) clear(events);
    eventsCursor = doc.next_cursor;
    const list = events.querySelector('ol') || events.appendChild(h('ol', { class: 'timeline' }));
    for (const e of doc.items) {
      list.append(h('li', { 'data-action': e.action }, h('span', { class: 'muted' }, when(e.created_at)), ' ',
        h('b', {}, e.action), ` by ${e.actor}`, e.detail && Object.keys(e.detail).length
          ? h('details', {}, h('summary', {}, 'detail'), h('pre', {}, json(e.detail))) : null));
    }
    events.querySelector('#more-events')?.remove();
    if (eventsCursor) {
      events.append(h('button', { type: 'button', id: 'more-events', onclick: () => loadEvents(true).catch(ctx.showError) },
        'Older… (more events)'));
    }
  }

  async function act(action, target, what) {
    try {
      const res = await run(action, target, what);
      if (res) { ctx.clearError(); await load(); }
    } catch (e) {
      ctx.showError(e);
    }
  }

  async function load() {
    let req; let workers = [];
    try {
      req = await api.get(`/v3/requests/${id}`);
      // a token of scope own does not see the class's workers
      if (ctx.me.scope !== 'own') workers = (await api.get('/v3/workers')).items;
    } catch (e) {
      if (!stopped) { ctx.showError(e); if (!req) return; }
    }
    if (stopped) return;
    const actions = requestActions(req, ctx);
    clear(main).append(
      h('h1', {}, 'Request ', h('span', { class: 'mono', id: 'request-id' }, req.id), ' ', badge(req.request_state)),
      h('div', { class: 'actions', id: 'request-actions' },
        actions.map((a) => h('button', { type: 'button', class: a.key === 'approve' || a.key === 'initiate' ? 'primary' : 'danger',
          'data-action': a.key, onclick: () => act(a, req, `request ${req.id.slice(0, 8)}`) }, a.label)),
        actions.length === 0 ? h('span', { class: 'muted' }, 'No action is open to this token in this state.') : null),
      h('section', { class: 'card', id: 'why' }, h('h2', {}, 'Why is it waiting?'),
        h('ul', {}, whyWaiting(req, workers).map((l) => h('li', {}, l)))),
      h('div', { class: 'cols' },
        h('section', { class: 'card' }, h('h2', {}, 'Request'), kv([
          ['template', req.template_key], ['network class', req.network_class], ['created by', req.created_by],
          ['created', when(req.created_at)], ['updated', when(req.updated_at)],
          ['frontier', (req.current_frontier || []).join(', ') || '—'],
          ['approvals', `${(req.approvals || []).filter((a) => a.decision === 'approve').length} of ${req.approvals_required}`],
          ['approval digest', h('span', { class: 'mono' }, req.approval_digest || '—')],
          ['last error', req.last_error_code || '—'],
          ['callback', req.callback_url || '—']])),
        h('section', { class: 'card' }, h('h2', {}, 'Intent'), kv(flat(req.intent)))),
      h('section', { class: 'card' }, h('h2', {}, 'DAG'), h('div', { class: 'dag-wrap' }, drawDag(req))),
      h('section', { class: 'card' }, h('h2', {}, 'Nodes'), table([
        { title: 'Node', cell: (n) => h('b', {}, n.node_key) },
        { title: 'Kind', cell: (n) => `${n.node_kind} / ${n.action_type}` },
        { title: 'Executor', cell: (n) => n.executor },
        { title: 'State', cell: (n) => badge(n.node_state) },
        { title: 'Attempts', cell: (n) => String(n.attempt_no) },
        { title: 'Next observe', cell: (n) => when(n.next_observe_at) },
        { title: 'Provider refs', cell: (n) => h('pre', {}, json(n.provider_refs)) },
        { title: 'Error', cell: (n) => (n.error_code ? `${n.error_code}: ${n.error_detail || ''}` : '') },
        // a manual step completed under signed approvals: who signed that it was done
        { title: 'Attested by', cell: (n) => (n.manual && n.manual.attested_by) || '' },
        { title: '', cell: (n) => nodeActions(req, n, ctx).map((a) => h('button', { type: 'button', 'data-action': a.key,
          'data-node': n.node_key, onclick: () => act(a, n, `node ${n.node_key}`) }, a.label)) },
      ], req.nodes, { id: 'nodes-table', class: 'list' })),
      h('section', { class: 'card' }, h('h2', {}, 'Approvals'), (req.approvals || []).length === 0
        ? h('p', { class: 'muted' }, 'None.')
        : table([
          { title: 'Principal', cell: (a) => a.principal },
          { title: 'Decision', cell: (a) => a.decision },
          { title: 'Comment', cell: (a) => a.comment || '' },
          { title: 'When', cell: (a) => when(a.created_at) }], req.approvals, { id: 'approvals-table', class: 'list' })),
      h('section', { class: 'card' }, h('h2', {}, 'Timeline (audit trail)'), events));
    await loadEvents(false);
    if (!TERMINAL.includes(req.request_state)) schedule();
  }

  // the next refresh; postponed while a confirmation dialog is open
  function schedule() {
    clearTimeout(timer);
    if (stopped) return;
    timer = setTimeout(() => {
      if (document.querySelector('dialog[open]')) schedule();
      else load().catch(ctx.showError);
    }, REFRESH_MS);
  }

  load().catch(ctx.showError);
  return () => { stopped = true; clearTimeout(timer); };
}
