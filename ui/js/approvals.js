// approvals.js -- the Approvals inbox: what waits for the signed-in
// principal (GET /v3/approvals), each with the document an approval
// approves shown field by field (the intent flattened) and its digest, what
// it lets qtg's signer sign (each plan node: what it pays, where, or that
// the signer signs none of it; as `qtgd approver sign` reads it), the
// approval statement an approver signs when approvals are signed (with
// `qtgd approver sign` on the approver's own machine; the signature is
// pasted here and sent with the vote), and Approve / Reject with a
// confirmation.
import * as api from './api.js';
import { h, clear, when, shortId, printable } from './dom.js';
import { REQUEST_ACTIONS, run } from './actions.js';

const APPROVE = REQUEST_ACTIONS.find((a) => a.key === 'approve');
const REJECT = REQUEST_ACTIONS.find((a) => a.key === 'reject');

function fields(obj, prefix = '') {
  const out = [];
  for (const key of Object.keys(obj || {}).sort()) {
    const v = obj[key];
    if (v && typeof v === 'object' && !Array.isArray(v)) out.push(...fields(v, `${prefix}${key}.`));
    else out.push([printable(`${prefix}${key}`), printable(v === null ? 'null' : typeof v === 'string' ? v : JSON.stringify(v))]);
  }
  return out;
}

function card(item, act) {
  const doc = item.approval_document || {};
  const signature = h('input', { type: 'text', class: 'mono signature', size: 40, spellcheck: 'false',
    autocomplete: 'off', placeholder: '128 hex digits' });
  return h('article', { class: 'card approval', 'data-id': item.id },
    h('h2', {}, h('a', { href: `#/request/${item.id}`, class: 'mono' }, shortId(item.id)), ` ${item.template_key}`),
    h('p', {}, `Created by ${item.created_by} ${when(item.created_at)}. `,
      `${item.approvals} of ${item.approvals_required} approvals`,
      item.rule ? ` (rule ${item.rule}${item.roles.length ? `, role ${item.roles.join(' or ')}` : ''})` : '',
      item.expires_at ? `; closes ${when(item.expires_at)}` : '', '.'),
    h('table', { class: 'frozen' },
      h('caption', {}, 'What an approval approves (frozen)'),
      h('tbody', {}, fields(doc).map(([k, v]) => h('tr', { 'data-field': k }, h('th', {}, k), h('td', { class: 'mono' }, v))))),
    h('p', {}, 'Digest (SHA-256): ', h('code', { class: 'digest' }, item.digest)),
    item.signer_may_sign ? h('pre', { class: 'mono payments' }, item.signer_may_sign) : null,
    item.approved_digest && item.approved_digest !== item.digest
      ? h('p', { class: 'error' }, `Earlier approvals were for digest ${item.approved_digest}: the request changed.`) : null,
    item.approval_statement ? h('details', { class: 'statement' },
      h('summary', {}, 'Approval statement (for signed approvals)'),
      h('pre', { class: 'mono statement' }, item.approval_statement),
      h('label', {}, 'Signature (qtgd approver sign) ',
        signature)) : null,
    h('div', { class: 'actions' },
      h('button', { type: 'button', class: 'primary', 'data-action': 'approve',
        onclick: () => act(APPROVE, item, signature.value.trim() ? { signature: signature.value.trim() } : undefined) }, 'Approve'),
      h('button', { type: 'button', class: 'danger', 'data-action': 'reject', onclick: () => act(REJECT, item) }, 'Reject')));
}

export function render(main, ctx) {
  const list = h('div', { id: 'inbox' });
  main.append(h('h1', {}, 'Approvals'),
    h('p', { class: 'muted' }, `Requests waiting for ${ctx.me.actor}: not created by it, not yet decided by it, and needing a role it holds.`),
    list);
  let stopped = false;
  const cursors = [null];

  async function act(action, item, extra) {
    try {
      const res = await run(action, item, `request ${shortId(item.id)}`, extra);
      if (res) { ctx.clearError(); await load(); }
    } catch (e) { ctx.showError(e); }
  }

  async function load(page = 0) {
    const doc = await api.get(`/v3/approvals${api.query({ limit: 20, cursor: cursors[page] })}`);
    if (stopped) return;
    clear(list);
    if (doc.items.length === 0) list.append(h('p', { class: 'muted', id: 'inbox-empty' }, 'Nothing waits for you.'));
    for (const item of doc.items) list.append(card(item, act));
    const nav = h('div', { class: 'toolbar' });
    if (page > 0) nav.append(h('button', { type: 'button', onclick: () => load(page - 1).catch(ctx.showError) }, '← Earlier'));
    if (doc.next_cursor) {
      cursors[page + 1] = doc.next_cursor;
      nav.append(h('button', { type: 'button', onclick: () => load(page + 1).catch(ctx.showError) }, 'Later →'));
    }
    list.append(nav);
  }
  load().catch(ctx.showError);
  return () => { stopped = true; };
}
