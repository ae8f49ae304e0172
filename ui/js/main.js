// main.js -- the console's shell: sign-in with an API token, who is signed
// in (GET /v3/me), the navigation, and the hash router that renders one
// page at a time (each page may return a cleanup for its timers).
import * as api from './api.js';
import { h, clear } from './dom.js';
import * as requests from './requests.js';
import * as detail from './detail.js';
import * as approvals from './approvals.js';
import * as deadletters from './deadletters.js';
import * as health from './health.js';

const main = document.getElementById('main');
const nav = document.getElementById('nav');
const who = document.getElementById('who');
const banner = document.getElementById('banner');

// The pages, by the first word of the hash; role: the role a token needs to
// see the page at all (each role by name: admin is not also the others, as
// the daemon checks it); classWide: about the whole
// network class, which a token of scope own does not see.
const PAGES = [
  { key: 'requests', title: 'Requests', page: requests, role: 'read' },
  { key: 'request', page: detail, role: 'read' },
  { key: 'approvals', title: 'Approvals', page: approvals, role: 'approve' },
  { key: 'dead-letters', title: 'Dead letters', page: deadletters, role: 'read' },
  { key: 'health', title: 'Workers and health', page: health, role: 'read', classWide: true },
];

let me = null;
let cleanup = null;

export function can(role) {
  return !!me && me.roles.includes(role);
}

function shows(page) {
  return can(page.role) && !(page.classWide && me.scope === 'own');
}

export function showError(e) {
  banner.hidden = false;
  clear(banner).append(e && e.message ? e.message : String(e));
}

export function clearError() { banner.hidden = true; clear(banner); }

function signInForm(message) {
  nav.hidden = true;
  clear(who);
  const input = h('input', { type: 'password', id: 'token', autocomplete: 'off', placeholder: 'qtg_…', size: 50 });
  const form = h('form', { id: 'signin', class: 'card' },
    h('h1', {}, 'Sign in'),
    h('p', {}, 'Paste an API token (made with qtgd tokens create). It is kept in this tab\'s session storage only.'),
    message && h('p', { class: 'error' }, message),
    h('label', { for: 'token' }, 'API token'), input,
    h('button', { type: 'submit' }, 'Sign in'));
  form.addEventListener('submit', (e) => {
    e.preventDefault();
    const t = input.value.trim();
    if (!t) return;
    api.setToken(t);
    start();
  });
  clear(main).append(form);
  input.focus();
}

function renderNav() {
  clear(nav);
  for (const p of PAGES) {
    if (p.title && shows(p)) nav.append(h('a', { href: `#/${p.key}`, 'data-page': p.key }, p.title));
  }
  nav.hidden = false;
  clear(who).append(
    h('span', { id: 'principal' }, `${me.actor} (${me.roles.join(', ')}${me.scope === 'own' ? '; its own requests' : ''}) · ${me.network_class}`),
    h('button', { type: 'button', id: 'signout', onclick: () => { api.forget(); me = null; signInForm(); } }, 'Sign out'));
}

function route() {
  if (!me) return;
  if (cleanup) { cleanup(); cleanup = null; }
  clearError();
  const hash = location.hash.replace(/^#\/?/, '') || 'requests';
  const [path, qs] = hash.split('?');
  const [key, ...rest] = path.split('/');
  const entry = PAGES.find((p) => p.key === key) || PAGES[0];
  for (const a of nav.querySelectorAll('a')) a.classList.toggle('active', a.dataset.page === entry.key);
  clear(main);
  if (!shows(entry)) {
    main.append(h('p', { class: 'error' }, can(entry.role)
      ? 'This token sees its own requests only; this page is about the whole network class.'
      : `This token lacks the ${entry.role} role this page needs.`));
    return;
  }
  const ctx = { me, can, showError, clearError, params: new URLSearchParams(qs || ''), args: rest };
  const result = entry.page.render(main, ctx);
  if (typeof result === 'function') cleanup = result;
}

async function start() {
  if (!api.token()) { signInForm(); return; }
  try {
    me = await api.get('/v3/me');
  } catch (e) {
    api.forget();
    signInForm(e.status === 401 ? `Not signed in: ${e.message}` : e.message);
    return;
  }
  renderNav();
  route();
}

window.addEventListener('hashchange', route);
window.addEventListener('unhandledrejection', (e) => showError(e.reason));
start();
