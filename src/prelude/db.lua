-- qtg.db prelude (src/lua_db.c runs it with the db table and the session
-- methods): the raw bindings return (value) or (nil, err); these wrappers
-- raise instead, and build transactions, savepoints and claims on them.
local db, session = ...
local raw_acquire, raw_query, raw_exec = db.raw_acquire, session.raw_query, session.raw_exec
-- acquire([share]) -> a session; share "api": one of the API's share of the pool (MG_API_DB_SESSIONS), which waits while the share is all in use and lets the workers' acquires go first
local SHARES = { api = true }
function db.acquire(share) if share ~= nil and not SHARES[share] then error('qtg.db.acquire: unknown share ' .. tostring(share) .. ' (the shares: api)', 2) end local s, err = raw_acquire(share ~= nil) if s == nil then error(err, 2) end return s end
function session:query(sql, ...) local rows, n = raw_query(self, sql, ...) if rows == nil then error(n, 2) end return rows, n end
-- batch({sql, v1, ...}, ...) -> rows1, ...: statements of a pipeline transaction sent together (one round trip); one by one while one is not prepared yet
local function one_by_one(self, n, ...) local out = {} for i = 1, n do local st = select(i, ...) out[i] = self:query(unpack(st, 1, #st)) end return unpack(out, 1, n) end
-- sent(raw, commit): batch or commit_batch on raw; one by one (then the commit) when raw answers false
local function sent(raw, commit) return function(self, ...) local n = select('#', ...) local r = { raw(self, ...) } if r[1] == false then local out = { one_by_one(self, n, ...) } if commit then self:commit() end return unpack(out, 1, n) end if r[1] == nil then error(r[2], 2) end return unpack(r, 1, n) end end
session.batch = sent(session.raw_batch, false)
-- commit_batch({sql, v1, ...}, ...) -> rows1, ...: a batch and the commit of its pipeline transaction in one round trip; one by one and then the commit while one is not prepared yet or the transaction is a block.  When it raises the caller rolls back as after any statement (nothing is left to roll back when the commit's round trip failed)
local commit_batch = sent(session.raw_batch_commit, true)
-- send_ahead({sql, v1, ...}, ...): statements of the pipeline transaction after this one, sent with this one's commit_batch (after its Sync, in its flush: the server runs them once it has committed); take_ahead() -> their rows, that transaction open, or nothing when they were not sent (the commit went one by one, as a COMMIT, or by commit or rollback, which forget them) or failed (that transaction is rolled back).  A commit_batch that raises leaves no transaction open
local aheads = setmetatable({}, { __mode = 'k' })
function session:send_ahead(...) aheads[self] = { n = select('#', ...), ... } end
function session:take_ahead() local a = aheads[self] aheads[self] = nil if a and a.rows and self:pipeline() then return unpack(a.rows, 1, a.n) end end
function session:commit_batch(...)
  local a = aheads[self]
  if not a or a.rows then aheads[self] = nil return commit_batch(self, ...) end
  local n = select('#', ...)
  local all = { ... }
  for i = 1, a.n do all[n + i] = a[i] end
  local r = { session.raw_batch_commit_ahead(self, a.n, unpack(all, 1, n + a.n)) }
  if r[1] == false then aheads[self] = nil return commit_batch(self, ...) end
  if r[1] == nil then aheads[self] = nil pcall(self.rollback, self) error(r[2], 2) end
  if r[n + 1] then a.rows = r[n + 1] else aheads[self] = nil pcall(self.rollback, self) end
  return unpack(r, 1, n)
end
function session:exec(sql) local rows, n = raw_exec(self, sql) if rows == nil then error(n, 2) end return rows, n end
local function raised(ok, err) if ok == nil then error(err, 3) end end
function session:begin() return self:query('BEGIN') end
-- A pipeline transaction sends no BEGIN and no COMMIT (src/qtg_pg.h):
-- commit and rollback end either kind; a savepoint turns it into a block.
function session:begin_pipeline() raised(session.raw_pipeline_begin(self)) end
function session:commit() aheads[self] = nil if self:pipeline() then return raised(session.raw_pipeline_commit(self)) end return self:query('COMMIT') end
function session:rollback() aheads[self] = nil if self:pipeline() then return raised(session.raw_pipeline_rollback(self)) end return self:query('ROLLBACK') end
-- commit_if_open(): commit the open transaction; nothing (nothing sent) when there is none, e.g. a commit_batch ended it, or when it is the one that commit_batch opened with statements sent ahead (its taker ends it)
function session:commit_if_open() local a = aheads[self] if a and a.rows then return end if self:pipeline() or self:in_transaction() then return self:commit() end end
-- run: fn's transaction, committed after it unless fn ended it itself
local function run(self, fn, ...) local r = { pcall(fn, ...) } if not r[1] then pcall(self.rollback, self) error(r[2], 0) end self:commit_if_open() return unpack(r, 2, table.maxn(r)) end
function session:transaction(fn, ...) self:begin() return run(self, fn, ...) end
function session:pipeline_transaction(fn, ...) self:begin_pipeline() return run(self, fn, ...) end
-- continue_transaction(fn, ...): fn in the transaction already open (the one take_ahead answered in), committed after it unless fn ended it, rolled back when fn raises
function session:continue_transaction(fn, ...) if not (self:pipeline() or self:in_transaction()) then error('continue_transaction: no transaction is open', 2) end return run(self, fn, ...) end
local function ident(name) assert(type(name) == 'string' and name:match('^[%a_][%w_]*$'), 'savepoint name must be an identifier') return name end
function session:savepoint(name) if self:pipeline() == 'implicit' then raised(session.raw_pipeline_block(self)) end return self:exec('SAVEPOINT "' .. ident(name) .. '"') end
function session:rollback_to(name) return self:exec('ROLLBACK TO SAVEPOINT "' .. ident(name) .. '"') end
function session:release_savepoint(name) return self:exec('RELEASE SAVEPOINT "' .. ident(name) .. '"') end
local claim = db.claim
function claim.one(s, spec) local row, err = claim.raw_one(s, spec) if row == nil and err ~= nil then error(err, 2) end return row end
function claim.try(s, sql, id, ...) local row, err = claim.raw_try(s, sql, id, ...) if row == nil and err ~= nil then error(err, 2) end return row end
local function with(share, fn, ...) local s = db.acquire(share) local ok, a, b, c = pcall(fn, s, ...) s:release() if not ok then error(a, 0) end return a, b, c end
function db.with_session(fn, ...) return with(nil, fn, ...) end
-- with_api_session(fn, ...): with_session on a session of the API's share
function db.with_api_session(fn, ...) return with('api', fn, ...) end
-- with_discarded_session(fn, ...): with_session whose connection is closed afterwards, not handed to the next task: for code that may change its session's state (set_config, an advisory lock, a PREPARE): the console's SQL
function db.with_discarded_session(fn, ...) local s = db.acquire() local ok, a, b, c = pcall(fn, s, ...) s:discard() if not ok then error(a, 0) end return a, b, c end
-- notify(channel, payload): a NOTIFY in a transaction of its own that does not wait for its WAL flush (so it holds PostgreSQL's notification lock only for itself: src/qtg_pg.c, "After-commit notifications"); a lost one costs its listeners latency, as a NOTIFY may.  The host calls it for a committed transaction's notification no handler in this process takes
function db.notify(channel, payload) db.with_session(function(s) s:query("SELECT set_config('synchronous_commit', 'off', true), pg_notify($1, $2)", channel, payload) end) end
