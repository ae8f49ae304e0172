// api.js -- the console's only way to the daemon: the HTTP API, with the
// bearer token kept in sessionStorage (gone when the tab closes; never in a
// URL or a cookie).  Every refusal comes back as an ApiError carrying the
// problem+json document.

const KEY = 'qtg.console.token';

export function token() { return sessionStorage.getItem(KEY); }
export function setToken(t) { sessionStorage.setItem(KEY, t); }
export function forget() { sessionStorage.removeItem(KEY); }

export class ApiError extends Error {
  constructor(status, problem) {
    super((problem && problem.detail) || `HTTP ${status}`);
    this.status = status;
    this.problem = problem || {};
  }
}

// call(method, path, body) -> the response's JSON (or text); throws ApiError.
export async function call(method, path, body) {
  const headers = { Accept: 'application/json' };
  const t = token();
  if (t) headers.Authorization = `Bearer ${t}`;
  const init = { method, headers, credentials: 'omit', cache: 'no-store', redirect: 'error' };
  if (body !== undefined) {
    headers['Content-Type'] = 'application/json';
    init.body = JSON.stringify(body);
  }
  const resp = await fetch(path, init);
  const type = resp.headers.get('Content-Type') || '';
  const doc = type.includes('json') ? await resp.json() : await resp.text();
  if (!resp.ok) throw new ApiError(resp.status, typeof doc === 'object' ? doc : { detail: doc });
  return doc;
}

export const get = (path) => call('GET', path);
export const post = (path, body) => call('POST', path, body === undefined ? {} : body);

// query({a: 1, b: ''}) -> "?a=1": empty values are left out.
export function query(params) {
  const q = new URLSearchParams();
  for (const [k, v] of Object.entries(params)) {
    if (v !== undefined && v !== null && v !== '') q.set(k, v);
  }
  const s = q.toString();
  return s ? `?${s}` : '';
}
