// actions.js -- the lifecycle actions the console offers, one table: which
// role each needs (as the API's route table says), in which states it is
// legal, what the API requires (a reason, an input, named fields such as
// a signature, sent as they are), and its route.  A
// page offers an action only when the signed-in token holds its role and
// the request (or node) is in one of its states; the API decides again.
import * as api from './api.js';
import { confirmAction, h } from './dom.js';

const IN_FLIGHT = ['SUBMITTING', 'SUBMITTED', 'OBSERVING'];
// the keys of the request's nodes in one of the states
const nodesIn = (r, states) => (r.nodes || []).filter((n) => states.includes(n.node_state)).map((n) => n.node_key);

// stopping(r): the request is bound for FAILED or MANUAL_INTERVENTION once
// its nodes in flight settle (a FAILED node, or an UNKNOWN one beside a
// completed side effect): no node of it starts (qtg.state.stopping).
export function stopping(r) {
  const nodes = r.nodes || [];
  return nodes.some((n) => n.node_state === 'FAILED') || (nodes.some((n) => n.node_state === 'UNKNOWN')
    && nodes.some((n) => n.node_state === 'COMPLETED' && n.side_effect === true));
}

export const REQUEST_ACTIONS = [
  // the maker's signature first, where the signer asks for it (initiation signed)
  { key: 'initiate', label: 'Sign as its maker', role: 'operate', states: ['PENDING_APPROVAL'], reason: 'none',
    fields: ['signature'], path: (r) => `/v3/requests/${r.id}/initiate`,
    lines: (r) => ['Sign this initiation statement with your own key (qtgd approver sign) and paste the signature.',
      h('pre', { class: 'mono statement' }, r.initiation_statement)],
    legal: (r, me) => !!r.initiation_statement && !r.initiated && r.created_by === me.actor },
  { key: 'approve', label: 'Approve', role: 'approve', states: ['PENDING_APPROVAL'], reason: 'optional',
    field: 'comment', path: (r) => `/v3/requests/${r.id}/approve`,
    legal: (r, me) => r.created_by !== me.actor && r.initiated !== false
      && !(r.approvals || []).some((a) => a.principal === me.actor) },
  { key: 'reject', label: 'Reject', role: 'approve', states: ['PENDING_APPROVAL'], reason: 'required',
    field: 'reason', path: (r) => `/v3/requests/${r.id}/reject`,
    legal: (r, me) => !(r.approvals || []).some((a) => a.principal === me.actor) },
  { key: 'cancel', label: 'Cancel', role: 'operate',
    states: ['PENDING_APPROVAL', 'APPROVED', 'EXECUTING', 'WAITING_MANUAL_ACTION', 'MANUAL_INTERVENTION'],
    reason: 'required', field: 'reason', path: (r) => `/v3/requests/${r.id}/cancel`,
    legal: (r) => !nodesIn(r, IN_FLIGHT).length && !nodesIn(r, ['UNKNOWN']).length },
  // beside an UNKNOWN node the API asks the operator to say that they found
  // out from the provider what its submit did (nothing recovers it after)
  { key: 'cancel-reconciled', label: 'Cancel (reconciled)', role: 'operate',
    states: ['EXECUTING', 'WAITING_MANUAL_ACTION', 'MANUAL_INTERVENTION'],
    reason: 'required', field: 'reason', body: { reconciled: true }, path: (r) => `/v3/requests/${r.id}/cancel`,
    lines: (r) => [`Node ${nodesIn(r, ['UNKNOWN']).join(', ')} is UNKNOWN: its submit may have reached the provider,`
      + ' and nothing recovers it once the request is cancelled.',
    'Cancel only after you have found out from the provider what it did; the audit trail records that you said so.'],
    legal: (r) => !nodesIn(r, IN_FLIGHT).length && nodesIn(r, ['UNKNOWN']).length > 0 },
  { key: 'resume', label: 'Resume', role: 'operate', states: ['MANUAL_INTERVENTION'], reason: 'none',
    path: (r) => `/v3/requests/${r.id}/resume` },
];

export const NODE_ACTIONS = [
  { key: 'retry', label: 'Retry', role: 'operate', states: ['FAILED', 'UNKNOWN'], reason: 'none',
    requestStates: ['FAILED', 'MANUAL_INTERVENTION', 'EXECUTING'], path: (n) => `/v3/nodes/${n.id}/retry` },
  { key: 'complete', label: 'Complete step', role: 'operate', states: ['READY'], reason: 'none', input: true,
    requestStates: ['WAITING_MANUAL_ACTION', 'EXECUTING'], manual: true, path: (n) => `/v3/nodes/${n.id}/complete`,
    legal: (r, me) => r.created_by !== me.actor && !stopping(r) },
];

export function requestActions(req, ctx) {
  return REQUEST_ACTIONS.filter((a) => ctx.can(a.role) && a.states.includes(req.request_state)
    && (!a.legal || a.legal(req, ctx.me)));
}

export function nodeActions(req, node, ctx) {
  return NODE_ACTIONS.filter((a) => ctx.can(a.role) && a.states.includes(node.node_state)
    && a.requestStates.includes(req.request_state) && (!a.manual || node.node_kind === 'manual')
    && (!a.legal || a.legal(req, ctx.me)));
}

// run(action, target, what[, extra]) -> the API's answer, or null when not
// confirmed.  A manual step's dialog shows its instructions and asks for
// its required inputs one field each, and under signed approvals shows its
// attestation statement and asks for the operator's signature of it; an
// action's own fields (a maker's signature) are asked the same way and
// sent as body fields; the action's body (a reconciled cancel's flag) and
// extra fields (an approval's signature) go into the body as given.
export async function run(action, target, what, extra) {
  const manual = action.input && target.manual ? target.manual : null;
  const attest = manual && manual.attestation_statement ? manual.attestation_statement : null;
  let lines = typeof action.lines === 'function' ? action.lines(target) : action.lines;
  if (manual) lines = manual.instructions ? [manual.instructions] : [];
  if (attest) {
    lines = lines.concat([`Sign this attestation statement with your own key (qtgd approver sign --kind attestation`
      + ` --step ${target.node_key}) and paste the signature: you attest that the step is done.`,
    h('pre', { class: 'mono statement' }, attest)]);
  }
  const answer = await confirmAction({ title: `${action.label} ${what}?`, lines,
    reason: action.reason, input: action.input, fields: manual ? manual.required_inputs : action.fields,
    signature: !!attest, confirm: action.label });
  if (!answer) return null;
  const body = {};
  if (action.field && answer.reason) body[action.field] = answer.reason;
  if (attest) body.signature = answer.signature;
  if (action.input) body.input = answer.input;
  else if (action.fields) Object.assign(body, answer.input);
  Object.assign(body, action.body || {}, extra || {});
  return api.post(action.path(target), body);
}
