// spec/ui/driver.mjs -- drives the web console in headless Chromium for
// spec/lua/api/ui_browser_spec.lua.  It only acts and observes: the spec seeds
// the database, then runs this with a JSON plan (argv[2]: a file) naming
// the daemon, the tokens and the rows to use, and checks what this reports
// against the database.  Each scenario runs in a fresh browser context (its
// own sessionStorage), signs in through the sign-in form, saves a
// screenshot of its page under the plan's out directory, and records every
// browser console error, page error and failed request.  The report (one
// JSON object, scenario name -> {ok, error, ...observations}) is written to
// the plan's report file.
//
// Usage: node spec/ui/driver.mjs PLAN.json   (NODE_PATH: `tools/browser node-path`)
import { readFileSync, writeFileSync, mkdirSync } from 'node:fs';
import { createRequire } from 'node:module';

const require = createRequire(import.meta.url);
const puppeteer = require('puppeteer-core');

const plan = JSON.parse(readFileSync(process.argv[2], 'utf8'));
mkdirSync(plan.out, { recursive: true });
// Each wait's bound.  Generous: under the suite's valgrind pass the machine's
// two cores run the spec process under valgrind, the daemon and Chromium, and
// one page of the 10,000-request list once took longer than 20 s there.
const TIMEOUT = 60000;

async function signIn(page, token) {
  await page.goto(`${plan.base}/ui/`, { waitUntil: 'domcontentloaded' });
  await page.waitForSelector('#signin #token', { timeout: TIMEOUT });
  await page.type('#token', token);
  await page.click('#signin button[type=submit]');
  await page.waitForSelector('#principal', { timeout: TIMEOUT });
}

async function confirmDialog(page, reason) {
  await page.waitForSelector('dialog[open] #confirm-ok', { timeout: TIMEOUT });
  if (reason !== undefined) await page.type('dialog[open] #confirm-reason', reason);
  await page.click('dialog[open] #confirm-ok');
  await page.waitForFunction(() => !document.querySelector('dialog[open]'), { timeout: TIMEOUT });
}

const texts = (page, sel) => page.$$eval(sel, (els) => els.map((e) => e.textContent.trim()));

const SCENARIOS = {
  // sign in, filter the list by destination, follow the row to its detail
  async filter(page) {
    await signIn(page, plan.tokens.reader);
    await page.waitForSelector('#requests-table, #no-rows', { timeout: TIMEOUT });
    await page.type('#f-destination', plan.filter.destination);
    await page.select('#f-state', plan.filter.state);
    await page.click('#apply');
    await page.waitForFunction((n) => document.querySelectorAll('#requests-table tbody tr').length === n
      || document.querySelector('#no-rows'), { timeout: TIMEOUT }, plan.filter.expect);
    const ids = await page.$$eval('#requests-table a[data-id]', (as) => as.map((a) => a.dataset.id));
    await page.screenshot({ path: `${plan.out}/requests.png`, fullPage: true });
    return { ids, hash: await page.evaluate(() => location.hash) };
  },

  // the DAG of a request: each node's state as drawn
  async dag(page) {
    await signIn(page, plan.tokens.reader);
    await page.goto(`${plan.base}/ui/#/request/${plan.dag.id}`);
    await page.waitForSelector('#dag g.node', { timeout: TIMEOUT });
    const nodes = await page.$$eval('#dag g.node', (gs) => gs.map((g) => ({
      key: g.dataset.nodeKey, state: g.dataset.state, frontier: g.classList.contains('frontier') })));
    const edges = await page.$$eval('#dag path.edge', (ps) => ps.map((p) => `${p.dataset.from}>${p.dataset.to}`));
    const why = await texts(page, '#why li');
    const actions = await page.$$eval('#request-actions button', (bs) => bs.map((b) => b.dataset.action));
    const timeline = await page.$$eval('#timeline li', (lis) => lis.map((l) => l.dataset.action));
    await page.screenshot({ path: `${plan.out}/request-detail.png`, fullPage: true });
    return { nodes, edges, why, actions, timeline };
  },

  // a second principal approves from the inbox; what it saw was frozen
  async approve(page) {
    await signIn(page, plan.tokens.approver);
    await page.goto(`${plan.base}/ui/#/approvals`);
    const card = `article.approval[data-id="${plan.approve.id}"]`;
    await page.waitForSelector(card, { timeout: TIMEOUT });
    const digest = await page.$eval(`${card} code.digest`, (c) => c.textContent);
    const fields = await page.$$eval(`${card} tr[data-field]`, (trs) => Object.fromEntries(
      trs.map((tr) => [tr.dataset.field, tr.querySelector('td').textContent])));
    const statement = await page.$eval(`${card} pre.statement`, (p) => p.textContent);
    const payments = await page.$eval(`${card} pre.payments`, (p) => p.textContent);
    await page.screenshot({ path: `${plan.out}/approvals.png`, fullPage: true });
    if (plan.approve.signature) {
      await page.click(`${card} details.statement summary`);
      await page.type(`${card} input.signature`, plan.approve.signature);
    }
    await page.click(`${card} button[data-action=approve]`);
    await confirmDialog(page, 'checked against the desk ticket');
    await page.waitForFunction((sel) => !document.querySelector(sel), { timeout: TIMEOUT }, card);
    return { digest, fields, statement, payments };
  },

  // reject from the detail page: Confirm stays disabled until a reason is typed
  async reject(page) {
    await signIn(page, plan.tokens.approver);
    await page.goto(`${plan.base}/ui/#/request/${plan.reject.id}`);
    await page.waitForSelector('#request-actions button[data-action=reject]', { timeout: TIMEOUT });
    await page.click('#request-actions button[data-action=reject]');
    await page.waitForSelector('dialog[open] #confirm-ok', { timeout: TIMEOUT });
    const disabledEmpty = await page.$eval('#confirm-ok', (b) => b.disabled);
    await page.type('#confirm-reason', '   ');
    const disabledBlank = await page.$eval('#confirm-ok', (b) => b.disabled);
    await page.click('#confirm-reason', { count: 3 });
    await page.keyboard.press('Backspace');
    await page.type('#confirm-reason', plan.reject.reason);
    const disabledTyped = await page.$eval('#confirm-ok', (b) => b.disabled);
    await page.screenshot({ path: `${plan.out}/reject-dialog.png` });
    await page.click('#confirm-ok');
    await page.waitForSelector('h1 .badge[data-state=REJECTED]', { timeout: TIMEOUT });
    return { disabledEmpty, disabledBlank, disabledTyped };
  },

  // cancel a request beside an UNKNOWN node: only the reconciled cancel is
  // offered, and its dialog says what the operator vouches for
  async cancelUnknown(page) {
    await signIn(page, plan.tokens.operator);
    await page.goto(`${plan.base}/ui/#/request/${plan.cancelUnknown.id}`);
    await page.waitForSelector('#request-actions button[data-action=cancel-reconciled]', { timeout: TIMEOUT });
    const actions = await page.$$eval('#request-actions button', (bs) => bs.map((b) => b.dataset.action));
    await page.click('#request-actions button[data-action=cancel-reconciled]');
    await page.waitForSelector('dialog[open] #confirm-ok', { timeout: TIMEOUT });
    const lines = await texts(page, 'dialog[open] p');
    await page.screenshot({ path: `${plan.out}/cancel-reconciled-dialog.png` });
    await confirmDialog(page, plan.cancelUnknown.reason);
    await page.waitForSelector('h1 .badge[data-state=CANCELLED]', { timeout: TIMEOUT });
    return { actions, lines };
  },

  // a request bound for FAILED with a manual step READY: no step offered,
  // and the panel says why nothing starts
  async stopping(page) {
    await signIn(page, plan.tokens.desk);
    await page.goto(`${plan.base}/ui/#/request/${plan.stopping.id}`);
    await page.waitForSelector('#why li', { timeout: TIMEOUT });
    await page.waitForSelector('#nodes-table', { timeout: TIMEOUT });
    const why = await texts(page, '#why li');
    const nodeActions = await page.$$eval('#nodes-table button[data-action]', (bs) => bs.map((b) => `${b.dataset.node}:${b.dataset.action}`));
    await page.screenshot({ path: `${plan.out}/stopping.png`, fullPage: true });
    return { why, nodeActions };
  },

  // redeliver one dead letter; count a bulk redelivery and back out
  async deadLetters(page) {
    await signIn(page, plan.tokens.operator);
    await page.goto(`${plan.base}/ui/#/dead-letters`);
    const btn = `button[data-action=redeliver][data-callback="${plan.dlq.id}"]`;
    await page.waitForSelector(btn, { timeout: TIMEOUT });
    await page.screenshot({ path: `${plan.out}/dead-letters.png`, fullPage: true });
    await page.click(btn);
    await confirmDialog(page);
    await page.waitForFunction((id) => document.querySelector('#dlq-status').textContent.includes(`Callback ${id} queued`),
      { timeout: TIMEOUT }, plan.dlq.id);
    const status = await page.$eval('#dlq-status', (s) => s.textContent);
    // the redelivered row is no longer offered for redelivery
    await page.waitForFunction((sel) => !document.querySelector(sel), { timeout: TIMEOUT }, btn);
    const rowText = await page.$$eval('#dlq-table tbody tr', (trs, id) => trs
      .filter((tr) => tr.cells[0].textContent === String(id)).map((tr) => tr.textContent).join(''), plan.dlq.id);
    await page.type('#bulk-request', plan.dlq.bulkRequest);
    await page.click('#bulk-count');
    await page.waitForSelector('dialog[open] h2', { timeout: TIMEOUT });
    const bulkTitle = await page.$eval('dialog[open] h2', (h) => h.textContent);
    await page.click('dialog[open] #confirm-cancel');
    return { status, rowText, bulkTitle };
  },

  // complete a manual step through its input form (one box per required input)
  async complete(page) {
    // the initiator is not offered its own request's step (four eyes)
    await signIn(page, plan.tokens.operator);
    await page.goto(`${plan.base}/ui/#/request/${plan.complete.id}`);
    await page.waitForSelector(`#dag g.node[data-node-key=${plan.complete.node}]`, { timeout: TIMEOUT });
    const offeredToInitiator = await page.$$eval('button[data-action=complete]', (bs) => bs.length);
    await page.evaluate(() => sessionStorage.clear());   // signed out
    await signIn(page, plan.tokens.desk);
    await page.goto(`${plan.base}/ui/#/request/${plan.complete.id}`);
    const btn = `button[data-action=complete][data-node=${plan.complete.node}]`;
    await page.waitForSelector(btn, { timeout: TIMEOUT });
    await page.click(btn);
    await page.waitForSelector('dialog[open] #confirm-ok', { timeout: TIMEOUT });
    const lines = await texts(page, 'dialog[open] p:not(.error)');
    const fields = await page.$$eval('dialog[open] input[data-field]', (is) => is.map((i) => i.name));
    const disabledEmpty = await page.$eval('#confirm-ok', (b) => b.disabled);
    await page.type(`dialog[open] input[data-field=${fields[0]}]`, plan.complete.reference);
    const disabledUnsigned = await page.$eval('#confirm-ok', (b) => b.disabled);
    // under signed approvals the operator signs the attestation it shows
    const statement = await page.$eval('dialog[open] pre.statement', (p) => p.textContent);
    await page.type('dialog[open] #confirm-signature', plan.complete.signature);
    const disabledTyped = await page.$eval('#confirm-ok', (b) => b.disabled);
    await page.screenshot({ path: `${plan.out}/complete-dialog.png` });
    await page.click('#confirm-ok');
    await page.waitForSelector(`#dag g.node[data-node-key=${plan.complete.node}]:not([data-state=READY])`, { timeout: TIMEOUT });
    // the nodes table names who attested it (its column before the actions)
    const attestedBy = await (await page.waitForFunction((key) => {
      const row = [...document.querySelectorAll('#nodes-table tbody tr')]
        .find((r) => r.querySelector('td b')?.textContent === key);
      const cells = row ? [...row.querySelectorAll('td')] : [];
      return (cells.length > 1 && cells[cells.length - 2].textContent) || null;
    }, { timeout: TIMEOUT }, plan.complete.node)).jsonValue();
    return { lines, fields, disabledEmpty, disabledUnsigned, disabledTyped, statement, attestedBy, offeredToInitiator };
  },

  // a read-only token: no approve, reject or cancel offered, no inbox link
  async readOnly(page) {
    await signIn(page, plan.tokens.reader);
    await page.goto(`${plan.base}/ui/#/request/${plan.readOnly.id}`);
    await page.waitForSelector('#request-actions', { timeout: TIMEOUT });
    const actions = await page.$$eval('#request-actions button', (bs) => bs.map((b) => b.dataset.action));
    const nav = await texts(page, '#nav a');
    await page.goto(`${plan.base}/ui/#/dead-letters`);
    await page.waitForSelector('#dlq-table, #dlq-empty', { timeout: TIMEOUT });
    const redeliverButtons = (await page.$$('button[data-action=redeliver]')).length;
    const bulkForm = (await page.$$('#bulk')).length;
    return { actions, nav, redeliverButtons, bulkForm };
  },

  async health(page) {
    await signIn(page, plan.tokens.reader);
    await page.goto(`${plan.base}/ui/#/health`);
    await page.waitForSelector('#workers-table tbody tr', { timeout: TIMEOUT });
    await page.waitForSelector('#heartbeats-table tbody tr', { timeout: TIMEOUT });
    const workers = await page.$$eval('#workers-table tbody tr', (trs) => trs.map((tr) => tr.cells[0].textContent));
    const checks = await page.$$eval('#readiness tbody tr', (trs) => trs.map((tr) => tr.cells[0].textContent));
    await page.screenshot({ path: `${plan.out}/health.png`, fullPage: true });
    return { workers, checks };
  },

  // initiation signed: no approval is offered before the maker signs; the
  // maker signs from the detail page, pasting its signature
  async initiate(page) {
    const actionsOf = () => page.$$eval('#request-actions button', (bs) => bs.map((b) => b.dataset.action));
    await signIn(page, plan.tokens.approver);
    await page.goto(`${plan.base}/ui/#/request/${plan.initiate.id}`);
    await page.waitForSelector('#request-actions', { timeout: TIMEOUT });
    const approverBefore = (await actionsOf()).filter((a) => a === 'approve');
    await page.evaluate(() => sessionStorage.clear());   // signed out
    await signIn(page, plan.tokens.operator);
    await page.goto(`${plan.base}/ui/#/request/${plan.initiate.id}`);
    await page.waitForSelector('#request-actions button[data-action=initiate]', { timeout: TIMEOUT });
    const whyBefore = await texts(page, '#why li');
    await page.click('#request-actions button[data-action=initiate]');
    await page.waitForSelector('dialog[open] pre.statement', { timeout: TIMEOUT });
    const statement = await page.$eval('dialog[open] pre.statement', (p) => p.textContent);
    await page.type('dialog[open] input[data-field=signature]', plan.initiate.signature);
    await page.screenshot({ path: `${plan.out}/initiate-dialog.png` });
    await page.click('#confirm-ok');
    await page.waitForFunction(() => !document.querySelector('#request-actions button[data-action=initiate]')
      && document.querySelector('#request-actions'), { timeout: TIMEOUT });
    const offeredAfter = (await actionsOf()).filter((a) => a === 'initiate').length;
    await page.evaluate(() => sessionStorage.clear());
    await signIn(page, plan.tokens.approver);
    await page.goto(`${plan.base}/ui/#/request/${plan.initiate.id}`);
    await page.waitForSelector('#request-actions button[data-action=approve]', { timeout: TIMEOUT });
    const approverAfter = await actionsOf();
    return { approverBefore, whyBefore, statement, offeredAfter, approverAfter };
  },

  // a token of scope own: its requests only, no workers and health page
  async ownScope(page) {
    await signIn(page, plan.tokens.own);
    const nav = await texts(page, '#nav a');
    await page.goto(`${plan.base}/ui/#/requests`);
    await page.waitForSelector('#requests-table a[data-id], #no-rows', { timeout: TIMEOUT });
    const ids = await page.$$eval('#requests-table a[data-id]', (as) => as.map((a) => a.dataset.id));
    await page.screenshot({ path: `${plan.out}/own-requests.png`, fullPage: true });
    await page.goto(`${plan.base}/ui/#/health`);
    await page.waitForSelector('#main p.error', { timeout: TIMEOUT });
    const healthText = await page.$eval('#main p.error', (p) => p.textContent);
    await page.goto(`${plan.base}/ui/#/request/${plan.ownScope.id}`);
    await page.waitForSelector('#request-id', { timeout: TIMEOUT });
    await page.waitForSelector('#timeline li', { timeout: TIMEOUT });
    const detailId = await page.$eval('#request-id', (e) => e.textContent);
    return { nav, ids, healthText, detailId };
  },

  // many rows: one page at a time, forward and back by cursor
  async paging(page) {
    await signIn(page, plan.tokens.reader);
    await page.goto(`${plan.base}/ui/#/requests?template_key=${plan.paging.template}&state=${plan.paging.state}`);
    const rows = () => page.$$eval('#requests-table a[data-id]', (as) => as.map((a) => a.dataset.id));
    await page.waitForSelector('#requests-table tbody tr', { timeout: TIMEOUT });
    const pages = [await rows()];
    for (let i = 0; i < plan.paging.pages - 1; i += 1) {
      const first = pages[pages.length - 1][0];
      await page.click('#next');
      await page.waitForFunction((id) => {
        const a = document.querySelector('#requests-table a[data-id]');
        return a && a.dataset.id !== id;
      }, { timeout: TIMEOUT }, first);
      pages.push(await rows());
    }
    await page.click('#prev');
    await page.waitForFunction((id) => {
      const a = document.querySelector('#requests-table a[data-id]');
      return a && a.dataset.id === id;
    }, { timeout: TIMEOUT }, pages[pages.length - 2][0]);
    const back = await rows();
    const domRows = await page.$$eval('tr', (trs) => trs.length);
    const status = await page.$eval('#list-status', (s) => s.textContent);
    return { pages, back, domRows, status };
  },
};

async function main() {
  const browser = await puppeteer.launch({
    executablePath: plan.chromium,
    headless: true,
    args: ['--no-sandbox', '--disable-gpu', '--disable-dev-shm-usage', '--no-first-run',
      '--disable-extensions', '--disable-background-networking', '--disable-component-update'],
  });
  const report = {};
  try {
    for (const name of plan.scenarios) {
      const context = await browser.createBrowserContext();
      const page = await context.newPage();
      await page.setViewport({ width: 1280, height: 800 });
      const problems = [];
      page.on('console', (m) => { if (m.type() === 'error') problems.push(`console: ${m.text()}`); });
      page.on('pageerror', (e) => problems.push(`page error: ${e.message}`));
      page.on('requestfailed', (r) => problems.push(`request failed: ${r.url()} ${r.failure()?.errorText}`));
      page.on('response', (r) => { if (r.status() >= 400) problems.push(`HTTP ${r.status()}: ${r.url()}`); });
      const started = Date.now();
      try {
        const seen = await SCENARIOS[name](page);
        report[name] = { ok: true, ...seen };
      } catch (e) {
        await page.screenshot({ path: `${plan.out}/${name}-failed.png`, fullPage: true }).catch(() => {});
        report[name] = { ok: false, error: String(e && e.stack ? e.stack : e) };
      }
      const banner = await page.$eval('#banner', (b) => (b.hidden ? '' : b.textContent)).catch(() => '');
      if (banner) problems.push(`banner: ${banner}`);
      report[name].problems = problems;
      report[name].seconds = (Date.now() - started) / 1000;
      await context.close();
    }
  } finally {
    await browser.close();
  }
  writeFileSync(plan.report, JSON.stringify(report, null, 1));
}

main().catch((e) => { console.error(e); process.exit(1); });
