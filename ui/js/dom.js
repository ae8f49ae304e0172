// dom.js -- building the pages without innerHTML (every value from the
// API is text, never markup), the confirmation dialog, and formatting.

function append(el, kids) {
  for (const k of kids.flat(Infinity)) {
    if (k === null || k === undefined || k === false) continue;
    el.append(k instanceof Node ? k : document.createTextNode(String(k)));
  }
  return el;
}

function setAttrs(el, attrs) {
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k.startsWith('on') && typeof v === 'function') el.addEventListener(k.slice(2), v);
    else if (k === 'text') el.textContent = v;
    else if (k === 'value') el.value = v;
    else el.setAttribute(k, v === true ? '' : String(v));
  }
  return el;
}

// h('a', {href: '#/x', class: 'c'}, 'text', child...)
export function h(tag, attrs, ...kids) {
  return append(setAttrs(document.createElement(tag), attrs), kids);
}

const SVG_NS = 'http://www.w3.org/2000/svg';
export function svg(tag, attrs, ...kids) {
  return append(setAttrs(document.createElementNS(SVG_NS, tag), attrs), kids);
}

export function clear(el) { while (el.firstChild) el.firstChild.remove(); return el; }

// A time as "2024-05-01 12:00:03 UTC (5 min ago)"; '' for null.
export function when(ts) {
  if (!ts) return '';
  const d = new Date(ts);
  if (Number.isNaN(d.getTime())) return String(ts);
  const iso = d.toISOString().replace('T', ' ').replace(/\.\d+Z$/, ' UTC');
  return `${iso} (${ago(d)})`;
}

export function ago(d) {
  const s = Math.round((Date.now() - d.getTime()) / 1000);
  const abs = Math.abs(s);
  const unit = abs < 90 ? `${abs} s` : abs < 5400 ? `${Math.round(abs / 60)} min`
    : abs < 129600 ? `${Math.round(abs / 3600)} h` : `${Math.round(abs / 86400)} d`;
  return s >= 0 ? `${unit} ago` : `in ${unit}`;
}

export function shortId(id) { return String(id).slice(0, 8); }

// printable(s): s with every character outside printable ASCII written as
// \u{X} (as `qtgd approver sign` shows them): on an approval card a value
// in look-alike letters, or with a right-to-left override, must not read as
// the text it imitates.
export function printable(s) {
  return String(s).replace(/[^\x20-\x7e]/gu, (c) => `\\u{${c.codePointAt(0).toString(16)}}`);
}

export function badge(state) {
  return h('span', { class: `badge st-${String(state).toLowerCase()}`, 'data-state': state }, state);
}

export function json(v) {
  if (v === null || v === undefined) return '';
  if (typeof v === 'object' && Object.keys(v).length === 0) return '';
  return JSON.stringify(v, null, 1);
}

// table(columns, rows): columns = [{title, cell(row) -> node|text}]
export function table(columns, rows, attrs) {
  return h('table', attrs || {},
    h('thead', {}, h('tr', {}, columns.map((c) => h('th', {}, c.title)))),
    h('tbody', {}, rows.map((r) => h('tr', c0(columns, r), columns.map((c) => h('td', {}, c.cell(r)))))));
}
function c0(columns, r) { return columns.rowAttrs ? columns.rowAttrs(r) : {}; }

// confirmAction({title, lines (text, or elements shown as they are), reason: 'required'|'optional'|'none',
// reasonLabel, input: bool, fields: [name...], signature: bool, confirm})
//   -> Promise<{reason, input, signature}|null>.
// A modal <dialog>: Confirm stays disabled while a required reason is
// empty, a named field is empty, the JSON input is not an object, or a
// signature asked for is not 128 hex digits.  With fields, the input is
// {name: value} from one text box each; with input and no fields, a JSON
// object typed in a text area; with signature, a box of its own (a
// manual step's attestation, beside the step's inputs).
export function confirmAction(opts) {
  return new Promise((resolve) => {
    const reason = opts.reason || 'none';
    const area = reason === 'none' ? null
      : h('textarea', { id: 'confirm-reason', rows: 3, placeholder: reason === 'required' ? 'required' : 'optional' });
    const names = opts.fields || [];
    const boxes = names.map((n, i) => h('input', { id: `confirm-field-${i}`, name: n, 'data-field': n, size: 40 }));
    const input = opts.input && names.length === 0 ? h('textarea', { id: 'confirm-input', rows: 6, class: 'mono' }, '{}') : null;
    const sig = opts.signature ? h('input', { id: 'confirm-signature', size: 64, class: 'mono', autocomplete: 'off',
      placeholder: '128 hex digits' }) : null;
    const problem = h('p', { class: 'error', id: 'confirm-problem' });
    const ok = h('button', { type: 'button', class: 'danger', id: 'confirm-ok' }, opts.confirm || 'Confirm');
    const cancel = h('button', { type: 'button', id: 'confirm-cancel' }, 'Cancel');
    const dlg = h('dialog', { class: 'confirm' },
      h('h2', {}, opts.title),
      (opts.lines || []).map((l) => (typeof l === 'string' ? h('p', {}, l) : l)),
      area && h('label', { for: 'confirm-reason' }, opts.reasonLabel || (reason === 'required' ? 'Reason (required)' : 'Comment (optional)')),
      area,
      boxes.map((b, i) => [h('label', { for: `confirm-field-${i}` }, `${names[i]} (required)`), b]),
      input && h('label', { for: 'confirm-input' }, 'Input (a JSON object)'),
      input,
      sig && h('label', { for: 'confirm-signature' }, 'Your signature of the statement above (required)'),
      sig,
      problem,
      h('div', { class: 'buttons' }, cancel, ok));
    const parsed = () => {
      if (boxes.length) return Object.fromEntries(boxes.map((b) => [b.name, b.value.trim()]));
      if (!input) return undefined;
      try {
        const v = JSON.parse(input.value);
        return v && typeof v === 'object' && !Array.isArray(v) ? v : null;
      } catch { return null; }
    };
    const check = () => {
      let why = '';
      if (reason === 'required' && !area.value.trim()) why = 'A reason is required.';
      else if (input && parsed() === null) why = 'The input must be a JSON object.';
      else if (boxes.some((b) => !b.value.trim())) why = 'Every field is required.';
      else if (sig && !/^[0-9a-f]{128}$/.test(sig.value.trim())) why = 'The signature is 128 lowercase hex digits.';
      ok.disabled = !!why;
      problem.textContent = why;
    };
    const done = (v) => { dlg.close(); dlg.remove(); resolve(v); };
    if (area) area.addEventListener('input', check);
    if (input) input.addEventListener('input', check);
    for (const b of boxes) b.addEventListener('input', check);
    if (sig) sig.addEventListener('input', check);
    cancel.addEventListener('click', () => done(null));
    dlg.addEventListener('cancel', (e) => { e.preventDefault(); done(null); });
    ok.addEventListener('click', () => done({ reason: area ? area.value.trim() : undefined, input: parsed(),
      signature: sig ? sig.value.trim() : undefined }));
    document.body.append(dlg);
    check();
    dlg.showModal();
    (boxes[0] || area || ok).focus();
  });
}
