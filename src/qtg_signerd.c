/* qtg_signerd.c -- `qtgd signer`: listen on a Unix socket, check each sign
 * request against the database rows, sign or refuse, log every decision in
 * signer_events.  See qtg_signerd.h for why it is its own process.
 *
 * One request per connection, one decision at a time: the signer does
 * nothing else, a decision is a few milliseconds, and a sequential server
 * has no shared state to get wrong.  The request lines are read from up to
 * QTG_SIGNERD_MAX_CONNS accepted connections at once (one poll(2) loop, no
 * threads), so a peer that connects and says nothing delays no other: a
 * connection is decided as soon as its whole line is in.  One whose line
 * has not arrived QTG_SIGNERD_IO_SECONDS after it was accepted (silent or
 * trickling) is cut off, and so is the oldest one when the table is full;
 * the cut-offs are logged, counted, at most once a second.
 *
 * A signer holding no key has nothing to sign and nothing to read: it
 * answers KEYS, ADDRESS and APPROVALS, refuses SIGN (SIGNER_NOT_FOUND), and
 * never connects to the database (a package's first start has none).
 *
 * What it reads is the last committed state: the dispatcher asks while its
 * own transaction (holding the node and request row locks) is open, and a
 * plain SELECT neither waits for those locks nor sees that transaction's
 * writes.  So "the node is being dispatched at attempt N" reads as: the
 * committed node row is READY with attempt_no = N - 1, of an APPROVED or
 * EXECUTING request; the nonce reservation, which the executor commits in
 * its own transaction before it asks, names the node, the nonce and the
 * payload hash.
 *
 * The one thing it writes is its decision (signer_events).  A decision that
 * reaches the one-nonce check (qtg_signerd_grant_begin) runs that check,
 * the signing and the decision's record in one transaction holding an
 * advisory lock on the request and plan node, and answers only once it is
 * committed: several signers sharing the database decide one transfer one
 * after the other.  Any other decision is recorded in a statement of its
 * own, and between decisions the connection is outside any transaction
 * (qtg_signerd_db_settle).
 */
#include "qtg_signerd.h"

#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <libpq-fe.h>

#include "qtg_approvers.h"
#include "qtg_crypto.h"
#include "qtg_keys.h"
#include "qtg_log.h"
#include "qtg_pg.h"
#include "qtg_notify.h"
#include "qtg_signer.h"
#include "qtg_signer_proto.h"

enum {
  QTG_SIGNERD_IO_SECONDS = 5,       /* a connection's whole request line */
  QTG_SIGNERD_STATEMENT_MS = 5000,
  QTG_SIGNERD_MAX_CONNS = 64,       /* connections whose line is being read */
  QTG_SIGNERD_CUT_LOG_MS = 1000     /* at most one cut-off log line per second */
};

/* An accepted connection whose request line is still arriving. */
typedef struct {
  int fd;                 /* -1: a free slot */
  struct ucred peer;
  int64_t deadline_ms;    /* accepted + QTG_SIGNERD_IO_SECONDS (qtg_signerd_now_ms) */
  size_t len;
  char *buf;              /* QTG_SIGNER_LINE_MAX + 2 bytes */
} qtg_signerd_conn;

typedef struct {
  qtg_keys *keys;
  PGconn *db;
  const char *db_url;           /* NULL: no key, no database */
  const char *db_user;
  int db_tcp_timeout;           /* MG_DB_TCP_TIMEOUT_SECONDS (qtg_pg_tcp_params) */
  long allowed_uid;
  const char *key_classes;      /* MG_SIGNER_KEY_CLASSES, checked at start */
  long nonce_ahead_max;         /* MG_SIGNER_NONCE_AHEAD_MAX, 0 no bound */
  qtg_approvers *approvers;     /* MG_SIGNER_APPROVERS, NULL when unset */
  const char *approvers_path;   /* "" when unset */
  long approvers_writer;        /* the uid that must not own it, -1 none */
  int approvers_broken;         /* a reload failed: nothing is signed */
  int listen_fd;
  qtg_signerd_conn conns[QTG_SIGNERD_MAX_CONNS];
  unsigned long cut, evicted;   /* cut off since the last log line (evicted: the table was full) */
  struct ucred cut_peer;        /* the last one cut off */
  int64_t cut_logged_ms;
} qtg_signerd;

/* A decision: what is answered and what signer_events records. */
typedef struct {
  int granted;
  char code[48];
  char reason[384];
  char digest[65];
  char payload_hash[67];
  char address[QTG_ADDRESS_HEX_LEN + 1];
  char signature[2 + 130 + 1];
  char plan_node[24], chain[24], nonce[24];   /* what a grant is for ("" unknown) */
} qtg_decision;

/* Set by signal handlers, read by the accept loop (one signer per
 * process: the handlers have no other way to reach it). */
static volatile sig_atomic_t qtg_signerd_stop, qtg_signerd_hup;

static void qtg_signerd_on_signal(int sig) {
  if (sig == SIGHUP) qtg_signerd_hup = 1;
  else qtg_signerd_stop = 1;
}

int qtg_signer_socket_path(const qtg_settings *s, const char *root_dir, char *buf,
                           size_t buflen, char *err, size_t errlen) {
  const char *explicit_path = qtg_settings_str(s, QTG_S_SIGNER_SOCKET);
  const char *run_dir = qtg_settings_str(s, QTG_S_RUN_DIR);
  const char *rt = getenv("RUNTIME_DIRECTORY");
  size_t max = sizeof(((struct sockaddr_un *)0)->sun_path);
  int n;
  if (max > buflen) max = buflen;
  if (explicit_path && explicit_path[0]) n = snprintf(buf, max, "%s", explicit_path);
  else if (run_dir && run_dir[0]) n = snprintf(buf, max, "%s/signer.sock", run_dir);
  else if (rt && rt[0]) n = snprintf(buf, max, "%s/signer.sock", rt);
  else n = snprintf(buf, max, "%s/var/run/signer.sock", root_dir ? root_dir : ".");
  if (n < 0 || (size_t)n >= max) {
    snprintf(err, errlen, "signer socket path is too long for a Unix socket (at most %zu bytes): "
             "set MG_SIGNER_SOCKET to a shorter path", max - 1);
    return -1;
  }
  return 0;
}

/* ---- database ---------------------------------------------------------------- */

static void qtg_signerd_db_drop(qtg_signerd *d) {
  if (d->db) PQfinish(d->db);
  d->db = NULL;
}

/* Between decisions the connection is outside any transaction.  One left
 * inside (a path that did not end it) is dropped, which rolls it back and
 * releases the advisory lock it holds, so the next decision never reads
 * an old snapshot's locks nor commits another decision's work. */
static void qtg_signerd_db_settle(qtg_signerd *d) {
  if (d->db == NULL || PQtransactionStatus(d->db) == PQTRANS_IDLE) return;
  qtg_log_error("signer: a decision left its database transaction open; dropping the connection");
  qtg_signerd_db_drop(d);
}

static PGconn *qtg_signerd_db(qtg_signerd *d) {
  if (d->db && PQstatus(d->db) == CONNECTION_OK) return d->db;
  qtg_signerd_db_drop(d);
  if (d->db_url == NULL) return NULL;
  /* the TCP bounds first, so that the URL's own values override them: a
   * database host that stops answering fails a decision as unavailable
   * instead of holding every request line for the kernel's 15 minutes */
  const char *keys[QTG_PG_TCP_PARAMS + 4], *vals[QTG_PG_TCP_PARAMS + 4];
  qtg_pg_tcp_values tcp;
  int n = qtg_pg_tcp_params(d->db_tcp_timeout, &tcp, keys, vals);
  keys[n] = "dbname", vals[n++] = d->db_url;
  if (d->db_user && d->db_user[0]) keys[n] = "user", vals[n++] = d->db_user;
  keys[n] = "application_name", vals[n++] = "qtgd signer";
  keys[n] = NULL, vals[n] = NULL;
  d->db = PQconnectdbParams(keys, vals, 1);
  if (d->db == NULL || PQstatus(d->db) != CONNECTION_OK) {
    qtg_log_warn("signer: cannot connect to the database: %s",
                 d->db ? PQerrorMessage(d->db) : "out of memory");
    qtg_signerd_db_drop(d);
    return NULL;
  }
  /* statement_timeout bounds every wait (a row or table lock, the
   * one-nonce check's advisory lock); idle_in_transaction_session_timeout
   * ends a session left inside that check's transaction (a signer stopped
   * there), which releases its lock.  search_path pg_catalog only: the
   * built-ins the checks recompute the digests with (jsonb_build_object,
   * sha256, ->>, ...) are pg_catalog's, never an overload another role
   * created in public or elsewhere on the path (one with exact argument
   * types wins over pg_catalog's VARIADIC "any"); the tables are named with
   * their schema. */
  char set[160];
  snprintf(set, sizeof set, "SET statement_timeout = %d; SET idle_in_transaction_session_timeout = %d;"
           " SET search_path = pg_catalog", QTG_SIGNERD_STATEMENT_MS, QTG_SIGNERD_STATEMENT_MS);
  PGresult *r = PQexec(d->db, set);
  int ok = r && PQresultStatus(r) == PGRES_COMMAND_OK;
  PQclear(r);
  if (!ok) {
    qtg_signerd_db_drop(d);
    return NULL;
  }
  return d->db;
}

/* The request, node, plan and approval facts of one decision.  The approval
 * digest is the expression of qtg_approval_digest (sql/0060) written out
 * with built-ins only: a role that can replace a qtg_* function cannot
 * change what is checked here.  The amount is read only from a JSON string
 * (NULL otherwise, refused): the daemon writes amounts as strings, and an
 * approver's tool cannot show a large JSON number exactly. */
static const char qtg_signerd_facts_sql[] =
    "WITH r AS ("
    " SELECT m.*, encode(sha256(convert_to(jsonb_build_object("
    "   'template_key', m.template_key, 'plan_version_id', m.plan_version_id,"
    "   'compiled_plan_hash', m.compiled_plan_hash, 'intent', m.intent,"
    "   'input_params', m.input_params, 'network_class', m.network_class,"
    "   'callback_url', m.callback_url)::text, 'UTF8')), 'hex') AS digest"
    "  FROM public.movement_requests m WHERE m.id = $1::uuid)"
    " SELECT r.request_state, r.approval_digest, r.digest, r.approvals_required,"
    "  (SELECT count(DISTINCT a.principal) FROM public.request_approvals a"
    "    WHERE a.request_id = r.id AND a.decision = 'approve' AND a.approval_digest = r.digest"
    "      AND a.principal IS DISTINCT FROM r.created_by) AS approvals,"
    "  (SELECT count(*) FROM public.request_approvals a"
    "    WHERE a.request_id = r.id AND a.decision = 'reject') AS rejects,"
    "  upper(r.intent->>'asset') AS asset,"
    "  CASE WHEN jsonb_typeof(r.intent->'amount') = 'string' THEN r.intent->>'amount' END AS amount,"
    "  CASE WHEN jsonb_typeof(pn.config->'destination') IS NULL THEN r.intent->>'destination'"
    "       WHEN jsonb_typeof(pn.config->'destination') = 'string' THEN pn.config->>'destination' END AS destination,"
    "  CASE WHEN pn.config ? 'chain_id' THEN pn.config->>'chain_id' ELSE r.intent->>'chain_id' END AS chain_id,"
    "  n.id IS NOT NULL AND n.request_id = r.id AND pn.plan_version_id = r.plan_version_id AS node_of_request,"
    "  n.node_state, n.attempt_no, n.executor, n.action_type, pn.config->>'signer_key' AS planned_key,"
    "  pn.id AS plan_node_id,"
    "  pv.risk_controls->>'max_fee_per_gas_wei' AS max_fee,"
    "  pv.risk_controls->>'max_amount' AS max_amount,"
    "  pv.risk_controls->>'max_priority_fee_per_gas_wei' AS max_tip,"
    "  COALESCE(pv.risk_controls->>'gas_limit', '21000') AS gas_limit,"
    "  CASE WHEN jsonb_typeof(pv.risk_controls->'allowed_chain_ids') = 'array' THEN"
    "   (SELECT COALESCE(string_agg(CASE WHEN jsonb_typeof(x) = 'number' THEN x::text ELSE '(not a number)' END, ','), '')"
    "      FROM jsonb_array_elements(pv.risk_controls->'allowed_chain_ids') x)"
    "  END AS allowed_chain_ids,"
    "  jsonb_typeof(pv.risk_controls->'allowed_chain_ids') AS allowed_chain_ids_type,"
    "  sr.expected_signer_address, r.network_class, r.id::text AS id, r.created_by,"
    "  encode(sha256(convert_to(jsonb_build_object('risk_controls', pv.risk_controls,"
    "   'nodes', COALESCE((SELECT jsonb_agg(jsonb_build_object('node_key', p2.node_key,"
    "     'node_kind', p2.node_kind, 'action_type', p2.action_type, 'executor', p2.executor,"
    "     'config', p2.config, 'after', COALESCE((SELECT jsonb_agg(pf.node_key ORDER BY pf.node_key)"
    "       FROM public.plan_edges e2 JOIN public.plan_nodes pf ON pf.id = e2.from_node_id"
    "      WHERE e2.to_node_id = p2.id), '[]'::jsonb)) ORDER BY p2.node_key)"
    "    FROM public.plan_nodes p2 WHERE p2.plan_version_id = pv.id), '[]'::jsonb))::text, 'UTF8')),"
    "   'hex') AS plan_digest,"
    "  pn.executor AS plan_executor, pn.action_type AS plan_action_type, r.initiation_signature,"
    "  (SELECT count(*) FROM public.plan_nodes p3 WHERE p3.plan_version_id = pv.id"
    "    AND p3.executor = 'evm_transfer' AND p3.action_type = 'evm_transfer') AS transfers,"
    "  (SELECT string_agg(p4.node_key || ' ' || COALESCE(n4.node_state, '(no node)'), ', '"
    "                     ORDER BY p4.node_key)"
    "     FROM public.plan_edges e JOIN public.plan_nodes p4 ON p4.id = e.from_node_id"
    "     LEFT JOIN public.movement_request_nodes n4 ON n4.request_id = r.id AND n4.plan_node_id = p4.id"
    "    WHERE e.to_node_id = pn.id AND n4.node_state IS DISTINCT FROM 'COMPLETED'"
    "      AND n4.node_state IS DISTINCT FROM 'SKIPPED') AS steps_before"
    " FROM r"
    " JOIN public.plan_versions pv ON pv.id = r.plan_version_id"
    " LEFT JOIN public.movement_request_nodes n ON n.id = $2::uuid"
    " LEFT JOIN public.plan_nodes pn ON pn.id = n.plan_node_id"
    " LEFT JOIN public.signer_roster sr ON sr.network_class = r.network_class AND sr.signer_key = $3";

enum {
  F_STATE, F_STORED_DIGEST, F_DIGEST, F_REQUIRED, F_APPROVALS, F_REJECTS, F_ASSET, F_AMOUNT,
  F_DESTINATION, F_CHAIN_ID, F_NODE_OF_REQUEST, F_NODE_STATE, F_ATTEMPT_NO, F_EXECUTOR,
  F_ACTION_TYPE, F_PLANNED_KEY, F_PLAN_NODE, F_MAX_FEE, F_MAX_AMOUNT, F_MAX_TIP, F_GAS_LIMIT,
  F_ALLOWED_CHAINS, F_ALLOWED_CHAINS_TYPE,
  F_EXPECTED, F_CLASS, F_ID, F_CREATED_BY, F_PLAN_DIGEST, F_PLAN_EXECUTOR, F_PLAN_ACTION_TYPE,
  F_INITIATION, F_TRANSFERS, F_STEPS_BEFORE, F__COUNT
};

/* The manual steps anywhere before a node in its sealed plan (the plan's
 * edges followed back), with the node each has in the request and its
 * attestation (MG_SIGNER_APPROVERS).  The runtime writes node states, so a
 * gate COMPLETED by the runtime alone proves nothing: its attestation,
 * signed by an enrolled person, does. */
static const char qtg_signerd_attested_sql[] =
    "WITH RECURSIVE before(id) AS ("
    "  SELECT e.from_node_id FROM public.plan_edges e"
    "   WHERE e.to_node_id = (SELECT n.plan_node_id FROM public.movement_request_nodes n"
    "                          WHERE n.id = $2::uuid AND n.request_id = $1::uuid)"
    "  UNION"
    "  SELECT e.from_node_id FROM public.plan_edges e JOIN before b ON e.to_node_id = b.id)"
    " SELECT p.node_key, n.node_state, n.attested_by, n.attestation_signature"
    "   FROM before b JOIN public.plan_nodes p ON p.id = b.id"
    "   LEFT JOIN public.movement_request_nodes n ON n.request_id = $1::uuid AND n.plan_node_id = p.id"
    "  WHERE starts_with(p.action_type, 'manual_') ORDER BY p.node_key";

/* The approvals given for a digest, with their signatures (MG_SIGNER_APPROVERS). */
static const char qtg_signerd_votes_sql[] =
    "SELECT principal, signature FROM public.request_approvals"
    " WHERE request_id = $1::uuid AND decision = 'approve' AND approval_digest = $2"
    "   AND signature IS NOT NULL ORDER BY id";

static const char qtg_signerd_reservation_sql[] =
    "SELECT 1 FROM public.evm_nonce_reservation"
    " WHERE request_node_id = $1::uuid AND chain_id = $2::bigint AND address = $3"
    "   AND nonce = $4::bigint AND payload_hash = $5"
    "   AND status IN ('reserved', 'signed', 'broadcast')";

/* The one-nonce check's lock: one key per request and plan node (64-bit
 * hash; a collision only makes two transfers wait for each other), named
 * apart from the daemon's own advisory locks (lua/qtg/evm_nonces.lua,
 * approvals.lua).  Held until the decision's record commits. */
static const char qtg_signerd_grant_lock_sql[] =
    "SELECT pg_advisory_xact_lock(hashtextextended("
    " 'qtg.signer.grant:' || $1::text || '/' || $2::text, 0))";

/* The nonce's lock, taken by a transfer's decision (after its one-nonce
 * lock) and by a fill's: a fill and a transfer at one nonce are decided
 * one after the other, so a transfer never slips in beside a fill being
 * granted.  Held until the decision's record commits. */
static const char qtg_signerd_nonce_lock_sql[] =
    "SELECT pg_advisory_xact_lock(hashtextextended("
    " 'qtg.signer.nonce:' || $1::text || '/' || $2::text || '/' || $3::text, 0))";

/* A fill granted at the nonce: nothing else is signed there any more
 * (the fill was asked for so that no transfer is mined at it). */
static const char qtg_signerd_filled_sql[] =
    "SELECT e.id FROM public.signer_events e"
    " WHERE e.decision = 'granted' AND e.code = 'FILL_GRANTED' AND e.chain_id = $1::bigint"
    "   AND e.signer_address = $2 AND e.nonce = $3::bigint ORDER BY e.id LIMIT 1";

/* The highest nonce this signer granted the sender on the chain (a fill
 * counts: one is granted only where a transfer was), and whether the
 * nonce asked ($3) is more than the bound ($4) above it, or above -1 for a
 * sender never granted there.  One probe of signer_events_at_nonce. */
static const char qtg_signerd_highest_grant_sql[] =
    "SELECT max(e.nonce)::text, $3::numeric > coalesce(max(e.nonce), -1)::numeric + $4::numeric"
    " FROM public.signer_events e"
    " WHERE e.decision = 'granted' AND e.nonce IS NOT NULL AND e.chain_id = $1::bigint"
    "   AND e.signer_address = $2";

/* An earlier grant for the same planned transfer of the request at another
 * chain, sender or nonce (sql/0171): signer_events is the signer's own
 * record, which the daemon's role cannot write.  A grant recorded before
 * sql/0171 names no nonce (nor plan node: its node row's is taken, and one
 * whose node row is gone counts for every plan node): it counts unless it
 * was for this very payload from this very sender, the one transaction at
 * its nonce.  nonce is NULL in the answer for such a grant. */
static const char qtg_signerd_granted_elsewhere_sql[] =
    "SELECT e.chain_id, e.signer_address, e.nonce FROM public.signer_events e"
    " WHERE e.request_id = $1::uuid AND e.decision = 'granted'"
    "   AND ((e.nonce IS NOT NULL AND e.plan_node_id = $2::bigint"
    "         AND (e.chain_id <> $3::bigint OR e.signer_address <> $4 OR e.nonce <> $5::bigint))"
    "     OR (e.nonce IS NULL"
    "         AND COALESCE(e.plan_node_id, (SELECT n.plan_node_id FROM public.movement_request_nodes n"
    "                                        WHERE n.id = e.request_node_id), $2::bigint) = $2::bigint"
    "         AND (e.signer_address IS DISTINCT FROM $4 OR e.payload_hash IS DISTINCT FROM $6)))"
    " ORDER BY e.id LIMIT 1";

static const char qtg_signerd_event_sql[] =
    "INSERT INTO public.signer_events (decision, code, reason, request_id, request_node_id, attempt_no,"
    " signer_key, signer_address, approval_digest, payload_hash, peer_uid, peer_pid,"
    " plan_node_id, chain_id, nonce)"
    " VALUES ($1, $2, $3, $4::uuid, $5::uuid, $6::int, $7, $8, $9, $10, $11::bigint, $12::bigint,"
    " $13::bigint, $14::bigint, $15::bigint)";

#define QTG_REFUSE(dec, c, ...)                                         \
  do {                                                                  \
    snprintf((dec)->code, sizeof (dec)->code, "%s", c);                 \
    snprintf((dec)->reason, sizeof (dec)->reason, __VA_ARGS__);         \
    return -1;                                                          \
  } while (0)

static const char *qtg_field(PGresult *r, int f) {
  return PQgetisnull(r, 0, f) ? NULL : PQgetvalue(r, 0, f);
}

/* A number in a row the signer reads (a cap, a chain id): decimal digits
 * only, as the daemon's checks write them; a hex or signed text, which
 * qtg_u256_parse would take or a reading of the row would not, is refused. */
static int qtg_parse_u256(const char *s, qtg_u256 *out) {
  if (s == NULL || *s == '\0') return -1;
  for (const char *p = s; *p != '\0'; p++)
    if (*p < '0' || *p > '9') return -1;
  return qtg_u256_parse(s, strlen(s), out);
}

/* A chain id: decimal digits (a JSON integer's text or a digit string) of
 * a value from 1 to 2^53 - 1, the range the daemon's executor and the
 * approvers' reading (src/prelude/approver.lua) take. */
static int qtg_parse_chain_id(const char *s, qtg_u256 *out) {
  if (qtg_parse_u256(s, out) != 0) return -1;
  for (int i = 0; i < 25; i++)
    if (out->be[i] != 0) return -1;
  if (out->be[25] >= 0x20) return -1;          /* 2^53 and above */
  for (int i = 25; i < 32; i++)
    if (out->be[i] != 0) return 0;
  return -1;                                    /* 0 */
}

/* A u256 that fits a bigint, as decimal text (for the reservation query). */
static int qtg_u256_bigint(const qtg_u256 *v, char *out, size_t outlen) {
  for (int i = 0; i < 24; i++)
    if (v->be[i] != 0) return -1;
  if (v->be[24] & 0x80) return -1;
  qtg_u256_decimal(v, out, outlen);
  return 0;
}

/* With MG_SIGNER_APPROVERS and 'initiation signed': the request's maker
 * (the person or initiator its created_by belongs to) signed its
 * initiation statement.  The maker is then known by a key, not by the row
 * the daemon's role writes. */
static int qtg_signerd_check_initiation(qtg_decision *dec, const qtg_approvers *a, PGresult *r) {
  const char *created_by = qtg_field(r, F_CREATED_BY), *sig = qtg_field(r, F_INITIATION);
  int maker = qtg_approvers_initiator_of(a, created_by);
  if (maker < 0)
    QTG_REFUSE(dec, "INITIATOR_NOT_ENROLLED",
               "the request's maker %s is not enrolled (MG_SIGNER_APPROVERS: initiation signed)",
               created_by ? created_by : "?");
  char statement[QTG_APPROVAL_STATEMENT_MAX];
  if (qtg_request_statement(statement, sizeof statement, QTG_STATEMENT_INITIATION,
                            qtg_approvers_deployment(a), qtg_field(r, F_ID), qtg_field(r, F_CLASS),
                            qtg_field(r, F_DIGEST), qtg_field(r, F_PLAN_DIGEST)) != 0 ||
      sig == NULL || !qtg_approvers_verify(a, maker, statement, strlen(statement), sig))
    QTG_REFUSE(dec, "INITIATION_UNSIGNED",
               "%s (%s) did not sign this request's initiation statement (MG_SIGNER_APPROVERS: "
               "initiation signed)", qtg_approvers_person_name(a, maker), created_by);
  return 0;
}

/* With MG_SIGNER_APPROVERS: count the enrolled persons whose signature of
 * the request's statement verifies, under any of their principals (each
 * person once; the initiator's person never), against the largest of the
 * request's quorum, the enrolment's for its network class and the
 * enrolment's tiers that hold for its intent's asset and amount times the
 * plan's evm_transfer nodes (each signed for that amount). */
static int qtg_signerd_check_signed(qtg_decision *dec, const qtg_approvers *a, PGresult *r,
                                    PGresult *votes) {
  const char *klass = qtg_field(r, F_CLASS);
  char rule[200];
  if (qtg_approvers_quorum(a, klass ? klass : "") < 0)
    QTG_REFUSE(dec, "QUORUM_NOT_ENROLLED",
               "MG_SIGNER_APPROVERS names no quorum for network class %s (nor *)", klass ? klass : "?");
  if (qtg_approvers_initiation_signed(a) && qtg_signerd_check_initiation(dec, a, r) != 0) return -1;
  long transfers = atol(qtg_field(r, F_TRANSFERS));
  int floor = qtg_approvers_quorum_for(a, klass ? klass : "", qtg_field(r, F_ASSET), qtg_field(r, F_AMOUNT),
                                       transfers < 0 ? 0 : transfers > 1000000 ? 1000000 : (uint32_t)transfers,
                                       rule, sizeof rule);
  if (floor < 0) QTG_REFUSE(dec, "APPROVALS_INCOMPLETE", "%s", rule);
  long need = atol(qtg_field(r, F_REQUIRED));
  if (need < floor) need = floor;
  else if (need > floor) snprintf(rule, sizeof rule, "the request's approvals_required");
  char statement[QTG_APPROVAL_STATEMENT_MAX];
  if (qtg_request_statement(statement, sizeof statement, QTG_STATEMENT_APPROVAL,
                            qtg_approvers_deployment(a), qtg_field(r, F_ID), klass,
                            qtg_field(r, F_DIGEST), qtg_field(r, F_PLAN_DIGEST)) != 0)
    QTG_REFUSE(dec, "APPROVALS_INCOMPLETE", "no approval statement can be formed for network class %s",
               klass ? klass : "?");
  size_t n = qtg_approvers_count(a);
  char *seen = calloc(n ? n : 1, 1);
  if (seen == NULL) QTG_REFUSE(dec, "SIGNER_INTERNAL", "out of memory");
  int initiator = qtg_approvers_person_of(a, qtg_field(r, F_CREATED_BY));
  long count = 0;
  for (int i = 0; i < PQntuples(votes); i++) {
    int who = qtg_approvers_person_of(a, PQgetvalue(votes, i, 0));
    if (who < 0 || who == initiator || seen[who]) continue;
    if (!qtg_approvers_verify(a, who, statement, strlen(statement), PQgetvalue(votes, i, 1))) continue;
    seen[who] = 1;
    count++;
  }
  free(seen);
  if (count < need)
    QTG_REFUSE(dec, "APPROVALS_INCOMPLETE",
               "%ld of %ld enrolled approvers signed this request's statement (MG_SIGNER_APPROVERS: %.130s)",
               count, need, rule);
  return 0;
}

/* With MG_SIGNER_APPROVERS: every manual step before the node (steps: rows
 * of qtg_signerd_attested_sql) is COMPLETED and attested: an enrolled
 * person, not the request's maker, signed its attestation statement. */
static int qtg_signerd_check_attested(qtg_decision *dec, const qtg_approvers *a, PGresult *r,
                                      PGresult *steps) {
  int maker = qtg_approvers_person_of(a, qtg_field(r, F_CREATED_BY));
  for (int i = 0; i < PQntuples(steps); i++) {
    const char *key = PQgetvalue(steps, i, 0);
    const char *state = PQgetisnull(steps, i, 1) ? "(no node)" : PQgetvalue(steps, i, 1);
    const char *by = PQgetisnull(steps, i, 2) ? NULL : PQgetvalue(steps, i, 2);
    const char *sig = PQgetisnull(steps, i, 3) ? NULL : PQgetvalue(steps, i, 3);
    if (strcmp(state, "COMPLETED") != 0)
      QTG_REFUSE(dec, "STEP_NOT_ATTESTED", "manual step %s before this one is %s, not COMPLETED", key, state);
    if (by == NULL || sig == NULL)
      QTG_REFUSE(dec, "STEP_NOT_ATTESTED", "manual step %s before this one carries no attestation "
                 "(MG_SIGNER_APPROVERS: a person signs that it is done)", key);
    int who = qtg_approvers_person_of(a, by);
    if (who < 0)
      QTG_REFUSE(dec, "STEP_NOT_ATTESTED", "manual step %s was attested by %.128s, who is no enrolled person",
                 key, by);
    if (who == maker)
      QTG_REFUSE(dec, "STEP_NOT_ATTESTED", "manual step %s was attested by %s, who made the request",
                 key, qtg_approvers_person_name(a, who));
    char statement[QTG_APPROVAL_STATEMENT_MAX];
    if (qtg_attestation_statement(statement, sizeof statement, qtg_approvers_deployment(a), qtg_field(r, F_ID),
                                  qtg_field(r, F_CLASS), qtg_field(r, F_DIGEST), qtg_field(r, F_PLAN_DIGEST),
                                  key) != 0 ||
        !qtg_approvers_verify(a, who, statement, strlen(statement), sig))
      QTG_REFUSE(dec, "STEP_NOT_ATTESTED", "%s did not sign the attestation of manual step %s of this request",
                 qtg_approvers_person_name(a, who), key);
  }
  return 0;
}

/* Every check on the facts, in order; the first that fails refuses.  votes
 * and steps are NULL unless MG_SIGNER_APPROVERS is set. */
static int qtg_signerd_check_facts(qtg_decision *dec, PGresult *r, const qtg_signer_line *l,
                                   const qtg_eip1559_tx *tx, const uint8_t key_addr[20],
                                   const char *key_classes, const qtg_approvers *approvers,
                                   PGresult *votes, PGresult *steps) {
  const char *state = qtg_field(r, F_STATE), *stored = qtg_field(r, F_STORED_DIGEST);
  const char *digest = qtg_field(r, F_DIGEST);
  qtg_u256 want, cap;
  snprintf(dec->digest, sizeof dec->digest, "%s", digest ? digest : "");
  if (stored == NULL || state == NULL ||
      (strcmp(state, "APPROVED") != 0 && strcmp(state, "EXECUTING") != 0))
    QTG_REFUSE(dec, "REQUEST_NOT_APPROVED", "request is %s%s", state ? state : "?",
               stored ? "" : " and holds no approval digest");
  if (digest == NULL || strcmp(stored, digest) != 0)
    QTG_REFUSE(dec, "APPROVAL_DIGEST_MISMATCH",
               "the request's rows hash to %.16s..., the approvals were given for %.16s...",
               digest ? digest : "?", stored);
  if (atol(qtg_field(r, F_REJECTS)) > 0)
    QTG_REFUSE(dec, "APPROVALS_INCOMPLETE", "the request was rejected by a principal");
  if (votes != NULL) {
    if (qtg_signerd_check_signed(dec, approvers, r, votes) != 0) return -1;
  } else if (atol(qtg_field(r, F_APPROVALS)) < atol(qtg_field(r, F_REQUIRED))) {
    QTG_REFUSE(dec, "APPROVALS_INCOMPLETE", "%s of %s approvals for this digest",
               qtg_field(r, F_APPROVALS), qtg_field(r, F_REQUIRED));
  }
  const char *of = qtg_field(r, F_NODE_OF_REQUEST);
  if (of == NULL || strcmp(of, "t") != 0)
    QTG_REFUSE(dec, "NODE_NOT_OF_REQUEST", "node is not a node of this request and its plan");
  const char *nstate = qtg_field(r, F_NODE_STATE);
  long attempt_no = atol(qtg_field(r, F_ATTEMPT_NO));
  if (strcmp(nstate, "READY") != 0 || attempt_no + 1 != l->attempt)
    QTG_REFUSE(dec, "NODE_NOT_DISPATCHING",
               "node is %s at attempt %ld (committed), not being dispatched at attempt %d",
               nstate, attempt_no, l->attempt);
  if (strcmp(qtg_field(r, F_EXECUTOR), "evm_transfer") != 0 ||
      strcmp(qtg_field(r, F_ACTION_TYPE), "evm_transfer") != 0)
    QTG_REFUSE(dec, "EXECUTOR_NOT_SIGNABLE", "node runs %s/%s: only evm_transfer nodes are signed",
               qtg_field(r, F_EXECUTOR), qtg_field(r, F_ACTION_TYPE));
  /* what the node does is its plan node's (covered by the plan digest the
   * approvers signed), not the node row's: the runtime inserts node rows */
  if (strcmp(qtg_field(r, F_PLAN_EXECUTOR), "evm_transfer") != 0 ||
      strcmp(qtg_field(r, F_PLAN_ACTION_TYPE), "evm_transfer") != 0)
    QTG_REFUSE(dec, "EXECUTOR_NOT_SIGNABLE",
               "the node's plan node runs %s/%s: only evm_transfer plan nodes are signed",
               qtg_field(r, F_PLAN_EXECUTOR), qtg_field(r, F_PLAN_ACTION_TYPE));
  /* the plan's order (its sealed edges): every step right before this one
   * done, as the engine readies a node; the runtime writes node states and
   * could make a transfer READY ahead of a manual gate */
  const char *before = qtg_field(r, F_STEPS_BEFORE);
  if (before != NULL)
    QTG_REFUSE(dec, "STEPS_BEFORE_NOT_DONE",
               "the plan's steps right before this one are not COMPLETED or SKIPPED: %s", before);
  if (steps != NULL && qtg_signerd_check_attested(dec, approvers, r, steps) != 0) return -1;
  const char *plan_node = qtg_field(r, F_PLAN_NODE);
  snprintf(dec->plan_node, sizeof dec->plan_node, "%s", plan_node ? plan_node : "");
  const char *planned = qtg_field(r, F_PLANNED_KEY);
  if (planned == NULL || strcmp(planned, l->key) != 0)
    QTG_REFUSE(dec, "SIGNER_KEY_NOT_PLANNED", "the node's plan names signer key %s, not %s",
               planned ? planned : "(none)", l->key);
  const char *klass = qtg_field(r, F_CLASS);
  if (!qtg_signer_key_serves_class(key_classes, l->key, klass ? klass : ""))
    QTG_REFUSE(dec, "KEY_NOT_FOR_CLASS",
               "key %s does not sign for network class %s (MG_SIGNER_KEY_CLASSES)", l->key,
               klass ? klass : "?");
  const char *expected = qtg_field(r, F_EXPECTED);
  if (expected != NULL) {
    uint8_t ex[20];
    if (qtg_signer_parse_address(expected, strlen(expected), ex) != 0 || memcmp(ex, key_addr, 20) != 0)
      QTG_REFUSE(dec, "SIGNER_IDENTITY_MISMATCH", "key %s is %s, the enrolled identity is %s",
                 l->key, dec->address, expected);
  }
  if (qtg_parse_chain_id(qtg_field(r, F_CHAIN_ID), &want) != 0)
    QTG_REFUSE(dec, "CHAIN_MISMATCH", "the approved request names no valid chain_id "
               "(decimal digits from 1 to 2^53 - 1)");
  if (qtg_u256_cmp(&want, &tx->chain_id) != 0)
    QTG_REFUSE(dec, "CHAIN_MISMATCH", "payload is for another chain than the approved %s",
               qtg_field(r, F_CHAIN_ID));
  /* a list the daemon's template check would have refused (a bare chain
   * id, null, an object) is not read as "no list" */
  const char *allowed = qtg_field(r, F_ALLOWED_CHAINS), *shape = qtg_field(r, F_ALLOWED_CHAINS_TYPE);
  if (shape != NULL && strcmp(shape, "array") != 0)
    QTG_REFUSE(dec, "CHAIN_NOT_ALLOWED", "the template's allowed_chain_ids is a JSON %s, not an array",
               shape);
  if (allowed != NULL) {
    /* every element is a chain id (the query gives "(not a number)" for an element
     * that is no JSON number), or the list allows nothing */
    int found = 0;
    char bad[64] = "";
    char *list = strdup(allowed);     /* whole: a cut list could match a cut id */
    if (list == NULL) QTG_REFUSE(dec, "SIGNER_INTERNAL", "out of memory");
    for (char *save = NULL, *t = strtok_r(list, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
      if (qtg_parse_chain_id(t, &cap) != 0) {
        if (bad[0] == '\0') snprintf(bad, sizeof bad, "%s", t);
      } else if (qtg_u256_cmp(&cap, &tx->chain_id) == 0) {
        found = 1;
      }
    }
    free(list);
    if (bad[0] != '\0')
      QTG_REFUSE(dec, "CHAIN_NOT_ALLOWED", "the template's allowed_chain_ids holds %s, which is no chain id "
                 "(a JSON integer from 1 to 2^53 - 1)", bad);
    if (!found)
      QTG_REFUSE(dec, "CHAIN_NOT_ALLOWED", "chain %s is not in the template's allowed_chain_ids",
                 qtg_field(r, F_CHAIN_ID));
  }
  const char *dest = qtg_field(r, F_DESTINATION);
  uint8_t to[20];
  if (dest == NULL || qtg_signer_parse_address(dest, strlen(dest), to) != 0)
    QTG_REFUSE(dec, "DESTINATION_MISMATCH", "the approved destination is not a literal address");
  if (!tx->has_to || memcmp(to, tx->to, 20) != 0)
    QTG_REFUSE(dec, "DESTINATION_MISMATCH", "payload pays another address than the approved %s", dest);
  const char *asset = qtg_field(r, F_ASSET), *amount = qtg_field(r, F_AMOUNT);
  if (asset == NULL || strcmp(asset, "ETH") != 0)
    QTG_REFUSE(dec, "VALUE_MISMATCH", "only the native asset (ETH) is signed, the request moves %s",
               asset ? asset : "(none)");
  if (amount == NULL || qtg_amount_to_units(amount, strlen(amount), 18, &want) != 0)
    QTG_REFUSE(dec, "VALUE_MISMATCH", "the approved amount is not a plain decimal string of at most 18 decimals");
  if (qtg_u256_cmp(&want, &tx->value) != 0) {
    char got[80];
    qtg_u256_decimal(&tx->value, got, sizeof got);
    QTG_REFUSE(dec, "VALUE_MISMATCH", "payload moves %s wei, the approved amount is %s ETH", got, amount);
  }
  /* the template's per-transfer cap, which the approvers signed with the
   * plan: a request created past the daemon's check is still refused */
  const char *max_amount = qtg_field(r, F_MAX_AMOUNT);
  if (max_amount != NULL && qtg_amount_to_units(max_amount, strlen(max_amount), 18, &cap) != 0)
    QTG_REFUSE(dec, "AMOUNT_ABOVE_CAP",
               "the template's max_amount is not a plain decimal of at most 18 decimals");
  if (max_amount != NULL && qtg_u256_cmp(&tx->value, &cap) > 0)
    QTG_REFUSE(dec, "AMOUNT_ABOVE_CAP", "the amount %s ETH exceeds the template's max_amount %s", amount,
               max_amount);
  if (tx->data_len != 0) QTG_REFUSE(dec, "DATA_NOT_ALLOWED", "a plain transfer carries no call data");
  /* the fee caps, each a decimal integer in the template's risk_controls */
  const struct { int field; const char *name, *what; const qtg_u256 *asked; } caps[] = {
    {F_MAX_FEE, "max_fee_per_gas_wei", "max_fee_per_gas", &tx->max_fee_per_gas},
    {F_MAX_TIP, "max_priority_fee_per_gas_wei", "max_priority_fee_per_gas", &tx->max_priority_fee_per_gas},
    {F_GAS_LIMIT, "gas_limit", "gas limit", &tx->gas_limit},
  };
  for (size_t i = 0; i < sizeof caps / sizeof caps[0]; i++) {
    const char *text = qtg_field(r, caps[i].field);
    if (text == NULL) QTG_REFUSE(dec, "FEES_ABOVE_CAP", "the template sets no %s", caps[i].name);
    if (qtg_parse_u256(text, &cap) != 0)
      QTG_REFUSE(dec, "FEES_ABOVE_CAP", "the template's %s is no decimal integer: %.40s", caps[i].name, text);
    if (qtg_u256_cmp(caps[i].asked, &cap) > 0)
      QTG_REFUSE(dec, "FEES_ABOVE_CAP", "%s exceeds the template's %s %s", caps[i].what, caps[i].name, text);
  }
  return 0;
}

/* One statement of a decision: its result, or NULL with a warning naming
 * what was read and the connection dropped (which ends any transaction). */
static PGresult *qtg_signerd_query(qtg_signerd *d, PGconn *db, const char *sql, int n,
                                   const char *const *params, const char *what) {
  PGresult *r = PQexecParams(db, sql, n, NULL, params, NULL, NULL, 0);
  if (r != NULL && PQresultStatus(r) == PGRES_TUPLES_OK) return r;
  qtg_log_warn("signer: %s failed: %s", what, PQerrorMessage(db));
  PQclear(r);
  qtg_signerd_db_drop(d);
  return NULL;
}

/* BEGIN the transaction of a decision (what: its name in the warning).  -1
 * with the connection dropped. */
static int qtg_signerd_begin(qtg_signerd *d, PGconn *db, const char *what) {
  PGresult *r = PQexec(db, "BEGIN");
  int ok = r != NULL && PQresultStatus(r) == PGRES_COMMAND_OK;
  PQclear(r);
  if (ok) return 0;
  qtg_log_warn("signer: opening %s failed: %s", what, PQerrorMessage(db));
  qtg_signerd_db_drop(d);
  return -1;
}

/* Open the one-nonce check's transaction and take its lock on the request
 * and plan node: a signer deciding the same transfer on another host waits
 * here until this decision's record commits, then reads its grant.  -1
 * with the connection dropped. */
static int qtg_signerd_grant_begin(qtg_signerd *d, PGconn *db, const char *request_id,
                                   const char *plan_node) {
  if (qtg_signerd_begin(d, db, "the one-nonce check") != 0) return -1;
  const char *p[2] = {request_id, plan_node};
  PGresult *r = qtg_signerd_query(d, db, qtg_signerd_grant_lock_sql, 2, p, "taking the one-nonce lock");
  if (r == NULL) return -1;
  PQclear(r);
  return 0;
}

/* One approved transfer, one nonce: transactions at one nonce replace each
 * other (one of them is mined at most), transactions at two nonces can
 * both be mined.  A second nonce needs a new approval.  Run under the
 * one-nonce lock.  0 no earlier grant elsewhere, -1 refused (dec filled),
 * -2 the database failed. */
static int qtg_signerd_check_earlier(qtg_signerd *d, PGconn *db, const qtg_signer_line *l,
                                     qtg_decision *dec) {
  const char *gp[6] = {l->request_id, dec->plan_node, dec->chain, dec->address, dec->nonce,
                       dec->payload_hash};
  PGresult *r = qtg_signerd_query(d, db, qtg_signerd_granted_elsewhere_sql, 6, gp, "reading earlier grants");
  if (r == NULL) return -2;
  if (PQntuples(r) == 0) {
    PQclear(r);
    return 0;
  }
  char was[160];
  if (PQgetisnull(r, 0, 2))
    snprintf(was, sizeof was, "a nonce not recorded (a grant from before sql/0171)");
  else
    snprintf(was, sizeof was, "nonce %s on chain %s from %s", PQgetvalue(r, 0, 2), PQgetvalue(r, 0, 0),
             PQgetvalue(r, 0, 1));
  PQclear(r);
  QTG_REFUSE(dec, "ALREADY_SIGNED_ELSEWHERE", "signed before at %s; one approval is signed at one nonce",
             was);
}

/* Take the lock of dec's chain, sender and nonce (their texts in np), then
 * run sql on them: its result, or NULL with the connection dropped. */
static PGresult *qtg_signerd_at_nonce(qtg_signerd *d, PGconn *db, const char *const np[3], const char *sql,
                                      const char *what) {
  PGresult *r = qtg_signerd_query(d, db, qtg_signerd_nonce_lock_sql, 3, np, "taking the nonce's lock");
  if (r == NULL) return NULL;
  PQclear(r);
  return qtg_signerd_query(d, db, sql, 3, np, what);
}

/* Take the nonce's lock, and refuse a nonce a fill was granted at.  0, -1
 * refused (dec filled), -2 the database failed. */
static int qtg_signerd_check_filled(qtg_signerd *d, PGconn *db, qtg_decision *dec) {
  const char *np[3] = {dec->chain, dec->address, dec->nonce};
  PGresult *r = qtg_signerd_at_nonce(d, db, np, qtg_signerd_filled_sql, "reading the fills at the nonce");
  if (r == NULL) return -2;
  if (PQntuples(r) == 0) {
    PQclear(r);
    return 0;
  }
  char id[24];
  snprintf(id, sizeof id, "%s", PQgetvalue(r, 0, 0));
  PQclear(r);
  QTG_REFUSE(dec, "NONCE_FILLED", "a fill was signed at nonce %s on chain %s from %s (signer event %s): nothing "
             "else is signed there", dec->nonce, dec->chain, dec->address, id);
}

/* Bytes signed far ahead of the chain can be kept (a runtime that hides
 * its rows) until the sender's nonce reaches them: a transfer is signed
 * at most MG_SIGNER_NONCE_AHEAD_MAX above the highest nonce this signer
 * granted its sender on its chain, so bytes kept from one grant wait
 * behind at most that many of its nonces; each further grant at the edge
 * moves it on (docs/security.md, "A signature ahead of the chain").
 * 0, -1 refused (dec filled), -2 the database failed. */
static int qtg_signerd_check_ahead(qtg_signerd *d, PGconn *db, qtg_decision *dec) {
  if (d->nonce_ahead_max <= 0) return 0;
  char bound[24];
  snprintf(bound, sizeof bound, "%ld", d->nonce_ahead_max);
  const char *p[4] = {dec->chain, dec->address, dec->nonce, bound};
  PGresult *r = qtg_signerd_query(d, db, qtg_signerd_highest_grant_sql, 4, p, "reading the highest grant");
  if (r == NULL) return -2;
  int ahead = PQntuples(r) == 1 && !PQgetisnull(r, 0, 1) && strcmp(PQgetvalue(r, 0, 1), "t") == 0;
  char highest[24];
  snprintf(highest, sizeof highest, "%s", PQntuples(r) == 1 && !PQgetisnull(r, 0, 0) ? PQgetvalue(r, 0, 0)
                                                                                      : "none");
  PQclear(r);
  if (!ahead) return 0;
  QTG_REFUSE(dec, "NONCE_TOO_FAR_AHEAD", "nonce %s is more than %ld above the highest nonce this signer granted "
             "%s on chain %s (%s): MG_SIGNER_NONCE_AHEAD_MAX", dec->nonce, d->nonce_ahead_max, dec->address,
             dec->chain, highest);
}

/* The nonce: one the daemon reserved for this node and payload, and the
 * only one this transfer is signed at.  From the one-nonce check on, the
 * decision runs in the transaction qtg_signerd_grant_begin opens, which
 * qtg_signerd_record commits with the decision's row (granted or refused);
 * a database failure drops the connection instead.  0 granted, -1
 * refused, -2 the database failed. */
static int qtg_signerd_decide_nonce(qtg_signerd *d, PGconn *db, const qtg_signer_line *l,
                                    const qtg_eip1559_tx *tx, qtg_decision *dec) {
  char chain[24], nonce[24];
  if (qtg_u256_bigint(&tx->chain_id, chain, sizeof chain) != 0 ||
      qtg_u256_bigint(&tx->nonce, nonce, sizeof nonce) != 0)
    QTG_REFUSE(dec, "NONCE_NOT_RESERVED", "chain id or nonce out of range");
  const char *rp[5] = {l->node_id, chain, dec->address, nonce, dec->payload_hash};
  PGresult *r = qtg_signerd_query(d, db, qtg_signerd_reservation_sql, 5, rp, "reading the nonce reservation");
  if (r == NULL) return -2;
  int reserved = PQntuples(r) == 1;
  PQclear(r);
  if (!reserved)
    QTG_REFUSE(dec, "NONCE_NOT_RESERVED",
               "no reservation of nonce %s on chain %s for this node and payload", nonce, chain);
  snprintf(dec->chain, sizeof dec->chain, "%s", chain);
  snprintf(dec->nonce, sizeof dec->nonce, "%s", nonce);
  if (qtg_signerd_grant_begin(d, db, l->request_id, dec->plan_node) != 0) return -2;
  int rc = qtg_signerd_check_earlier(d, db, l, dec);
  if (rc != 0) return rc;
  rc = qtg_signerd_check_filled(d, db, dec);
  if (rc != 0) return rc;
  rc = qtg_signerd_check_ahead(d, db, dec);
  if (rc != 0) return rc;
  uint8_t sighash[32];
  qtg_signature sig;
  qtg_keccak256(l->payload, l->payload_len, sighash);
  if (qtg_keys_sign_hash(d->keys, l->key, sighash, &sig) != QTG_SIGNER_OK)
    QTG_REFUSE(dec, "SIGNER_INTERNAL", "signing failed");
  qtg_signer_signature_hex(&sig, dec->signature);
  dec->granted = 1;
  snprintf(dec->code, sizeof dec->code, "GRANTED");
  snprintf(dec->reason, sizeof dec->reason, "the payload is what request %s approved", l->request_id);
  return 0;
}

/* What SIGN and FILL check first: the payload's hash (into dec), the
 * enrolment readable, the key loaded (its address into key_addr and dec),
 * the payload an EIP-1559 transaction (into tx).  0, or -1 refused. */
static int qtg_signerd_read_payload(qtg_signerd *d, const qtg_signer_line *l, qtg_eip1559_tx *tx,
                                    uint8_t key_addr[20], uint8_t hash[32], qtg_decision *dec) {
  char why[160];
  qtg_keccak256(l->payload, l->payload_len, hash);
  dec->payload_hash[0] = '0', dec->payload_hash[1] = 'x';
  qtg_hex_encode(hash, 32, dec->payload_hash + 2);
  if (d->approvers_broken)
    QTG_REFUSE(dec, "APPROVERS_UNREADABLE", "MG_SIGNER_APPROVERS %s could not be read at the last "
               "reload: nothing is signed until it is fixed and reloaded", d->approvers_path);
  if (qtg_keys_signer_address(d->keys, l->key, key_addr) != 0)
    QTG_REFUSE(dec, "SIGNER_NOT_FOUND", "no signer key %s is loaded", l->key);
  qtg_signer_address_hex(key_addr, dec->address);
  if (qtg_eip1559_decode(l->payload, l->payload_len, tx, why, sizeof why) != 0)
    QTG_REFUSE(dec, "PAYLOAD_NOT_EIP1559", "%s", why);
  return 0;
}

/* 0 granted, -1 refused (dec filled), -2 the database failed. */
static int qtg_signerd_decide_sign(qtg_signerd *d, const qtg_signer_line *l, qtg_decision *dec) {
  qtg_eip1559_tx tx;
  uint8_t key_addr[20], hash[32];
  if (qtg_signerd_read_payload(d, l, &tx, key_addr, hash, dec) != 0) return -1;
  PGconn *db = qtg_signerd_db(d);
  if (db == NULL) return -2;
  const char *params[5] = {l->request_id, l->node_id, l->key, NULL, NULL};
  PGresult *r = PQexecParams(db, qtg_signerd_facts_sql, 3, NULL, params, NULL, NULL, 0);
  if (r == NULL || PQresultStatus(r) != PGRES_TUPLES_OK) {
    qtg_log_warn("signer: reading the request failed: %s", PQerrorMessage(db));
    PQclear(r);
    qtg_signerd_db_drop(d);
    return -2;
  }
  if (PQntuples(r) == 0) {
    PQclear(r);
    QTG_REFUSE(dec, "REQUEST_NOT_FOUND", "no request %s", l->request_id);
  }
  PGresult *votes = NULL, *steps = NULL;
  if (d->approvers != NULL) {
    const char *vp[2] = {l->request_id, qtg_field(r, F_DIGEST)};
    const char *sp[2] = {l->request_id, l->node_id};
    votes = PQexecParams(db, qtg_signerd_votes_sql, 2, NULL, vp, NULL, NULL, 0);
    if (votes != NULL && PQresultStatus(votes) == PGRES_TUPLES_OK)
      steps = PQexecParams(db, qtg_signerd_attested_sql, 2, NULL, sp, NULL, NULL, 0);
    if (steps == NULL || PQresultStatus(steps) != PGRES_TUPLES_OK) {
      qtg_log_warn("signer: reading the approvals and attestations failed: %s", PQerrorMessage(db));
      PQclear(steps);
      PQclear(votes);
      PQclear(r);
      qtg_signerd_db_drop(d);
      return -2;
    }
  }
  int rc = qtg_signerd_check_facts(dec, r, l, &tx, key_addr, d->key_classes, d->approvers, votes, steps);
  PQclear(steps);
  PQclear(votes);
  PQclear(r);
  if (rc != 0) return -1;
  return qtg_signerd_decide_nonce(d, db, l, &tx, dec);
}

/* ---- FILL: a nonce voided by a 0-value transfer to itself ---------------------------
 *
 * A nonce the signer granted a transfer at can hold bytes that will never
 * be mined where they are wanted (refused by the RPC: the sender's later
 * transfers wait behind the gap for ever), or bytes a compromised daemon
 * kept and hid (docs/security.md, "A signature ahead of the chain").  A
 * fill uses that nonce up with a transfer that moves nothing: the key's
 * address to itself, value 0, no data, 21,000 gas, fees within the caps of
 * the plan the granted transfer was signed under.  Only a nonce the
 * signer's own log shows a transfer granted at is filled (signer_events:
 * the daemon's role cannot write it), for a key that serves that request's
 * class; with MG_SIGNER_APPROVERS, only for an enrolled person's Ed25519
 * signature of the fill statement (qtg_fill_statement), whoever relays it.
 * The grant is recorded with no request (code FILL_GRANTED), so it never
 * stands for a transfer, nor justifies another fill; from then on no
 * transfer is signed at that nonce (NONCE_FILLED): a kept transfer signed
 * again at the fee cap would otherwise outbid the fill.  A fill and a
 * transfer at one nonce are decided under one lock. */
static const char qtg_signerd_fill_grant_sql[] =
    "SELECT m.network_class, pv.risk_controls->>'max_fee_per_gas_wei',"
    "  pv.risk_controls->>'max_priority_fee_per_gas_wei', e.request_id::text"
    " FROM public.signer_events e"
    " LEFT JOIN public.movement_requests m ON m.id = e.request_id"
    " LEFT JOIN public.plan_versions pv ON pv.id = m.plan_version_id"
    " WHERE e.decision = 'granted' AND e.request_id IS NOT NULL AND e.chain_id = $1::bigint"
    "   AND e.signer_address = $2 AND e.nonce = $3::bigint"
    " ORDER BY e.id DESC LIMIT 1";

enum { G_CLASS, G_MAX_FEE, G_MAX_TIP, G_REQUEST };

/* What a fill's payload must be, and who must have asked for it (the
 * grant row g read; dec's chain, nonce and address set).  0, or -1
 * refused (dec filled). */
static int qtg_signerd_check_fill(qtg_signerd *d, const qtg_signer_line *l, const qtg_eip1559_tx *tx,
                                  const uint8_t key_addr[20], PGresult *g, qtg_decision *dec) {
  qtg_u256 cap, gas, zero;
  memset(&zero, 0, sizeof zero);
  if (!tx->has_to || memcmp(tx->to, key_addr, 20) != 0)
    QTG_REFUSE(dec, "FILL_NOT_SELF", "a fill pays the key's own address %s", dec->address);
  if (qtg_u256_cmp(&tx->value, &zero) != 0) QTG_REFUSE(dec, "FILL_NOT_SELF", "a fill moves nothing: its value is 0");
  if (tx->data_len != 0) QTG_REFUSE(dec, "DATA_NOT_ALLOWED", "a fill carries no call data");
  if (qtg_parse_u256("21000", &gas) != 0 || qtg_u256_cmp(&tx->gas_limit, &gas) != 0)
    QTG_REFUSE(dec, "FEES_ABOVE_CAP", "a fill's gas limit is 21000");
  if (PQntuples(g) == 0)
    QTG_REFUSE(dec, "NONCE_NOT_GRANTED", "no transfer was granted at nonce %s on chain %s from %s: only such a "
               "nonce is filled", dec->nonce, dec->chain, dec->address);
  const char *klass = PQgetisnull(g, 0, G_CLASS) ? NULL : PQgetvalue(g, 0, G_CLASS);
  if (klass == NULL)
    QTG_REFUSE(dec, "REQUEST_NOT_FOUND", "request %s, granted at this nonce, is gone: no fee cap to fill under",
               PQgetvalue(g, 0, G_REQUEST));
  if (!qtg_signer_key_serves_class(d->key_classes, l->key, klass))
    QTG_REFUSE(dec, "KEY_NOT_FOR_CLASS", "key %s does not sign for network class %s (MG_SIGNER_KEY_CLASSES)",
               l->key, klass);
  const struct { int field; const char *name, *what; const qtg_u256 *asked; } caps[] = {
    {G_MAX_FEE, "max_fee_per_gas_wei", "max_fee_per_gas", &tx->max_fee_per_gas},
    {G_MAX_TIP, "max_priority_fee_per_gas_wei", "max_priority_fee_per_gas", &tx->max_priority_fee_per_gas},
  };
  for (size_t i = 0; i < sizeof caps / sizeof caps[0]; i++) {
    const char *text = PQgetisnull(g, 0, caps[i].field) ? NULL : PQgetvalue(g, 0, caps[i].field);
    if (text == NULL) QTG_REFUSE(dec, "FEES_ABOVE_CAP", "the granted transfer's plan sets no %s", caps[i].name);
    if (qtg_parse_u256(text, &cap) != 0)
      QTG_REFUSE(dec, "FEES_ABOVE_CAP", "the plan's %s is no decimal integer: %.40s", caps[i].name, text);
    if (qtg_u256_cmp(caps[i].asked, &cap) > 0)
      QTG_REFUSE(dec, "FEES_ABOVE_CAP", "%s exceeds the plan's %s %s", caps[i].what, caps[i].name, text);
  }
  if (d->approvers == NULL) return 0;
  char statement[QTG_APPROVAL_STATEMENT_MAX];
  int person = qtg_approvers_person_of(d->approvers, l->principal);
  if (person < 0)
    QTG_REFUSE(dec, "FILL_NOT_SIGNED", "%s is no enrolled person's principal: a fill is signed for by a person",
               l->principal);
  if (l->signature[0] == '\0')
    QTG_REFUSE(dec, "FILL_NOT_SIGNED", "a fill needs %s's signature of its statement (qtgd approver sign-fill)",
               l->principal);
  if (qtg_fill_statement(statement, sizeof statement, qtg_approvers_deployment(d->approvers), dec->chain,
                         dec->address, dec->nonce) != 0)
    QTG_REFUSE(dec, "FILL_NOT_SIGNED", "no fill statement can be written for chain %s, nonce %s", dec->chain,
               dec->nonce);
  if (!qtg_approvers_verify(d->approvers, person, statement, strlen(statement), l->signature))
    QTG_REFUSE(dec, "FILL_NOT_SIGNED", "the signature is not %s's of the statement filling nonce %s on chain %s "
               "from %s", qtg_approvers_person_name(d->approvers, person), dec->nonce, dec->chain, dec->address);
  return 0;
}

/* 0 granted, -1 refused (dec filled), -2 the database failed. */
static int qtg_signerd_decide_fill(qtg_signerd *d, const qtg_signer_line *l, qtg_decision *dec) {
  qtg_eip1559_tx tx;
  uint8_t key_addr[20], hash[32];
  if (qtg_signerd_read_payload(d, l, &tx, key_addr, hash, dec) != 0) return -1;
  if (qtg_u256_bigint(&tx.chain_id, dec->chain, sizeof dec->chain) != 0 ||
      qtg_u256_bigint(&tx.nonce, dec->nonce, sizeof dec->nonce) != 0) {
    dec->chain[0] = dec->nonce[0] = '\0';
    QTG_REFUSE(dec, "NONCE_NOT_GRANTED", "chain id or nonce out of range");
  }
  PGconn *db = qtg_signerd_db(d);
  if (db == NULL) return -2;
  if (qtg_signerd_begin(d, db, "a fill's decision") != 0) return -2;
  const char *gp[3] = {dec->chain, dec->address, dec->nonce};
  PGresult *g = qtg_signerd_at_nonce(d, db, gp, qtg_signerd_fill_grant_sql, "reading the grant at the nonce");
  if (g == NULL) return -2;
  int rc = qtg_signerd_check_fill(d, l, &tx, key_addr, g, dec);
  PQclear(g);
  if (rc != 0) return -1;
  qtg_signature sig;
  if (qtg_keys_sign_hash(d->keys, l->key, hash, &sig) != QTG_SIGNER_OK)
    QTG_REFUSE(dec, "SIGNER_INTERNAL", "signing failed");
  qtg_signer_signature_hex(&sig, dec->signature);
  dec->granted = 1;
  snprintf(dec->code, sizeof dec->code, "FILL_GRANTED");
  snprintf(dec->reason, sizeof dec->reason, "a 0-value transfer of %s to itself at nonce %s on chain %s, for %s%s",
           dec->address, dec->nonce, dec->chain, l->principal,
           d->approvers != NULL ? " (signed)" : " (no enrolment: not signed)");
  return 0;
}

/* COMMIT: 1 when it committed (in a failed transaction COMMIT answers
 * ROLLBACK), else 0. */
static int qtg_signerd_commit(PGconn *db) {
  PGresult *r = PQexec(db, "COMMIT");
  int ok = r != NULL && PQresultStatus(r) == PGRES_COMMAND_OK && strcmp(PQcmdStatus(r), "COMMIT") == 0;
  PQclear(r);
  return ok;
}

/* Append the decision, and commit the one-nonce check's transaction when
 * the decision is in one: a grant is answered only once this returns 0.
 * -1 when it could not be recorded (the connection dropped: an open
 * transaction rolls back).  A signer holding no key has no database: it
 * grants nothing, and its log line (which the caller writes) is the only
 * record of a refusal. */
static int qtg_signerd_record(qtg_signerd *d, const qtg_decision *dec, const qtg_signer_line *l,
                              int parsed, const struct ucred *peer) {
  if (d->db_url == NULL) return 0;
  PGconn *db = qtg_signerd_db(d);
  if (db == NULL) return -1;
  char attempt[16], uid[24], pid[24];
  int sign = parsed && l->verb == QTG_SIGNER_VERB_SIGN;
  snprintf(attempt, sizeof attempt, "%d", sign ? l->attempt : 0);
  snprintf(uid, sizeof uid, "%lu", (unsigned long)peer->uid);
  snprintf(pid, sizeof pid, "%ld", (long)peer->pid);
  const char *p[15] = {
      dec->granted ? "granted" : "refused", dec->code, dec->reason,
      sign ? l->request_id : NULL, sign ? l->node_id : NULL, sign ? attempt : NULL,
      parsed && l->key[0] ? l->key : NULL, dec->address[0] ? dec->address : NULL,
      dec->digest[0] ? dec->digest : NULL, dec->payload_hash[0] ? dec->payload_hash : NULL,
      uid, pid, dec->plan_node[0] ? dec->plan_node : NULL, dec->chain[0] ? dec->chain : NULL,
      dec->nonce[0] ? dec->nonce : NULL};
  /* a grant is recorded in the transaction that checked for earlier ones,
   * never on a connection opened since */
  if (dec->granted && PQtransactionStatus(db) != PQTRANS_INTRANS) {
    qtg_log_warn("signer: a grant outside its one-nonce check is not recorded");
    qtg_signerd_db_drop(d);
    return -1;
  }
  PGresult *r = PQexecParams(db, qtg_signerd_event_sql, 15, NULL, p, NULL, NULL, 0);
  int ok = r != NULL && PQresultStatus(r) == PGRES_COMMAND_OK;
  PQclear(r);
  if (ok && PQtransactionStatus(db) == PQTRANS_INTRANS) ok = qtg_signerd_commit(db);
  if (!ok || PQtransactionStatus(db) != PQTRANS_IDLE) {
    qtg_log_warn("signer: recording the decision failed: %s", PQerrorMessage(db));
    qtg_signerd_db_drop(d);
    return -1;
  }
  return 0;
}

/* ---- connections ------------------------------------------------------------------- */

static void qtg_signerd_write(int fd, const char *s, size_t len) {
  while (len > 0) {
    ssize_t n = write(fd, s, len);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    s += n;
    len -= (size_t)n;
  }
}

static void qtg_signerd_answer(int fd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void qtg_signerd_answer(int fd, const char *fmt, ...) {
  char buf[1024];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(buf, sizeof buf - 1, fmt, ap);
  va_end(ap);
  if (n < 0) return;
  if ((size_t)n > sizeof buf - 2) n = (int)sizeof buf - 2;
  for (int i = 0; i < n; i++)
    if (buf[i] == '\n' || buf[i] == '\r') buf[i] = ' ';
  buf[n++] = '\n';
  qtg_signerd_write(fd, buf, (size_t)n);
}

static int64_t qtg_signerd_now_ms(void) {
  struct timespec ts;
  if (clock_gettime(CLOCK_MONOTONIC, &ts) != 0) return 0;
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void qtg_signerd_reload_approvers(qtg_signerd *d);

/* Decide one whole request line (buf, len, without the LF) of an allowed
 * peer, record the decision and answer it. */
static void qtg_signerd_serve(qtg_signerd *d, int fd, const struct ucred *peer,
                              const char *buf, size_t len) {
  qtg_decision dec;
  qtg_signer_line line;
  char err[160];
  int parsed = 0;
  memset(&dec, 0, sizeof dec);
  memset(&line, 0, sizeof line);
  int rc = qtg_signer_line_parse(buf, len, &line, err, sizeof err);
  if (rc != 0) {
    snprintf(dec.code, sizeof dec.code, rc == -2 ? "SIGNER_INTERNAL" : "SIGNER_BAD_REQUEST");
    snprintf(dec.reason, sizeof dec.reason, "%s", err);
  } else if (line.verb == QTG_SIGNER_VERB_KEYS) {
    char names[1024] = "";
    size_t used = 0;
    for (size_t i = 0; i < qtg_keys_signer_count(d->keys); i++) {
      int n = snprintf(names + used, sizeof names - used, " %s", qtg_keys_signer_name(d->keys, i));
      if (n < 0 || (size_t)n >= sizeof names - used) break;
      used += (size_t)n;
    }
    qtg_signerd_answer(fd, "OK%s", names);
    return;
  } else if (line.verb == QTG_SIGNER_VERB_APPROVALS) {
    if (d->approvers_broken)
      qtg_signerd_answer(fd, "REFUSED APPROVERS_UNREADABLE %s could not be read at the last reload: "
                             "nothing is signed until it is fixed and reloaded", d->approvers_path);
    else if (d->approvers != NULL)
      qtg_signerd_answer(fd, "OK enrolled %s %s", qtg_approvers_deployment(d->approvers),
                         qtg_approvers_digest(d->approvers));
    else
      qtg_signerd_answer(fd, "OK %s", qtg_keys_signer_count(d->keys) > 0 ? "trusting-rows" : "none");
    return;
  } else if (line.verb == QTG_SIGNER_VERB_ADDRESS) {
    uint8_t addr[20];
    char hex[QTG_ADDRESS_HEX_LEN + 1];
    if (qtg_keys_signer_address(d->keys, line.key, addr) != 0) {
      qtg_signerd_answer(fd, "REFUSED SIGNER_NOT_FOUND no signer key %s is loaded", line.key);
    } else {
      qtg_signer_address_hex(addr, hex);
      qtg_signerd_answer(fd, "OK %s", hex);
    }
    return;
  } else {
    parsed = 1;
    /* A reload asked for while lines waited (each decision may wait on the
     * database up to its statement timeout) applies from the next decision,
     * not after every waiting line: a revoked approver stops counting at
     * once. */
    if (qtg_signerd_hup) {
      qtg_signerd_hup = 0;
      qtg_signerd_reload_approvers(d);
    }
    rc = line.verb == QTG_SIGNER_VERB_FILL ? qtg_signerd_decide_fill(d, &line, &dec)
                                           : qtg_signerd_decide_sign(d, &line, &dec);
    if (rc == -2) {
      qtg_signer_line_free(&line);
      qtg_signerd_answer(fd, "REFUSED SIGNER_DB_UNAVAILABLE the signer cannot read the database");
      return;
    }
  }
  if (qtg_signerd_record(d, &dec, &line, parsed, peer) != 0) {
    qtg_signer_line_free(&line);
    qtg_signerd_answer(fd, "REFUSED SIGNER_DB_UNAVAILABLE the signer cannot record its decision");
    return;
  }
  const char *f[] = {"code", dec.code, "request_id", parsed ? line.request_id : "",
                     "node_id", parsed ? line.node_id : "", "reason", dec.reason, NULL};
  qtg_log_fields(dec.granted ? QTG_LOG_INFO : QTG_LOG_WARN,
                 dec.granted ? "signer: granted" : "signer: refused", f);
  if (dec.granted) qtg_signerd_answer(fd, "OK %s %s", dec.signature, dec.address);
  else qtg_signerd_answer(fd, "REFUSED %s %s", dec.code, dec.reason);
  qtg_signer_line_free(&line);
}

/* ---- the connection table ------------------------------------------------------- */

/* A peer of another uid: answered, recorded and logged at once, before it
 * can send anything. */
static void qtg_signerd_refuse_peer(qtg_signerd *d, int fd, const struct ucred *peer) {
  qtg_decision dec;
  qtg_signer_line line;
  memset(&dec, 0, sizeof dec);
  memset(&line, 0, sizeof line);
  snprintf(dec.code, sizeof dec.code, "PEER_NOT_ALLOWED");
  snprintf(dec.reason, sizeof dec.reason, "uid %lu may not use this signer", (unsigned long)peer->uid);
  qtg_logf(QTG_LOG_WARN, "code", dec.code, "signer: refused a peer: %s", dec.reason);
  qtg_signerd_db_settle(d);
  if (qtg_signerd_record(d, &dec, &line, 0, peer) != 0)
    qtg_log_warn("signer: the refusal of uid %lu is not recorded", (unsigned long)peer->uid);
  qtg_signerd_answer(fd, "REFUSED %s %s", dec.code, dec.reason);
}

static void qtg_signerd_conn_close(qtg_signerd_conn *c) {
  if (c->fd >= 0) close(c->fd);
  free(c->buf);
  c->fd = -1;
  c->buf = NULL;
  c->len = 0;
}

/* Close a connection that sent no whole request line in time (evicted: the
 * table was full and it was the oldest), counted for qtg_signerd_log_cuts. */
static void qtg_signerd_cut(qtg_signerd *d, qtg_signerd_conn *c, int evicted) {
  d->cut++;
  if (evicted) d->evicted++;
  d->cut_peer = c->peer;
  qtg_signerd_conn_close(c);
}

/* One log line for the cut-offs since the last one, at most one a second
 * (force: now, at stop): a flood of silent connections shows in the log
 * without filling the disk. */
static void qtg_signerd_log_cuts(qtg_signerd *d, int64_t now, int force) {
  if (d->cut == 0 || (!force && now - d->cut_logged_ms < QTG_SIGNERD_CUT_LOG_MS)) return;
  char count[24], evicted[24], secs[16], uid[24], pid[24];
  snprintf(count, sizeof count, "%lu", d->cut);
  snprintf(evicted, sizeof evicted, "%lu", d->evicted);
  snprintf(secs, sizeof secs, "%d", QTG_SIGNERD_IO_SECONDS);
  snprintf(uid, sizeof uid, "%lu", (unsigned long)d->cut_peer.uid);
  snprintf(pid, sizeof pid, "%ld", (long)d->cut_peer.pid);
  const char *f[] = {"count", count, "evicted", evicted, "deadline_seconds", secs,
                     "last_peer_uid", uid, "last_peer_pid", pid, NULL};
  qtg_log_fields(QTG_LOG_WARN, "signer: cut off connections that sent no whole request in time", f);
  d->cut = d->evicted = 0;
  d->cut_logged_ms = now;
}

/* A free slot, else the oldest connection's, cut off to make room: a peer
 * that fills the table loses its own oldest connections, not the signer. */
static qtg_signerd_conn *qtg_signerd_slot(qtg_signerd *d) {
  qtg_signerd_conn *oldest = &d->conns[0];
  for (int i = 0; i < QTG_SIGNERD_MAX_CONNS; i++) {
    if (d->conns[i].fd < 0) return &d->conns[i];
    if (d->conns[i].deadline_ms < oldest->deadline_ms) oldest = &d->conns[i];
  }
  qtg_signerd_cut(d, oldest, 1);
  return oldest;
}

/* Accept one pending connection (the listening socket does not block): a
 * refused peer is answered at once, an allowed one gets a slot and its
 * deadline.  -1 when none is pending. */
static int qtg_signerd_accept(qtg_signerd *d) {
  int fd = accept4(d->listen_fd, NULL, NULL, SOCK_CLOEXEC);
  if (fd < 0) return errno == EINTR || errno == ECONNABORTED ? 0 : -1;
  struct ucred peer;
  socklen_t plen = sizeof peer;
  struct timeval tv = {QTG_SIGNERD_IO_SECONDS, 0};
  if (setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv) != 0 ||
      getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &peer, &plen) != 0) {
    qtg_log_warn("signer: cannot set up a connection: %s", strerror(errno));
    close(fd);
    return 0;
  }
  if ((long)peer.uid != d->allowed_uid) {
    qtg_signerd_refuse_peer(d, fd, &peer);
    close(fd);
    return 0;
  }
  qtg_signerd_conn *c = qtg_signerd_slot(d);
  c->buf = malloc(QTG_SIGNER_LINE_MAX + 2);
  if (c->buf == NULL) {
    qtg_log_warn("signer: out of memory for a connection");
    close(fd);
    return 0;
  }
  c->fd = fd;
  c->peer = peer;
  c->len = 0;
  c->deadline_ms = qtg_signerd_now_ms() + QTG_SIGNERD_IO_SECONDS * 1000;
  return 0;
}

/* Accept what is pending, as many as there are free slots (at least one:
 * the oldest makes room). */
static void qtg_signerd_accept_some(qtg_signerd *d) {
  int room = 0;
  for (int i = 0; i < QTG_SIGNERD_MAX_CONNS; i++)
    if (d->conns[i].fd < 0) room++;
  if (room == 0) room = 1;
  while (room-- > 0 && qtg_signerd_accept(d) == 0) {}
}

/* Read what has arrived on c (poll said it is readable, so one read does
 * not block).  1 its whole line is in (c->len, without the LF), 0 more is
 * to come, -1 the peer closed or failed, -2 the line is longer than a
 * request can be. */
static int qtg_signerd_conn_read(qtg_signerd_conn *c) {
  size_t cap = QTG_SIGNER_LINE_MAX + 2;
  ssize_t got = read(c->fd, c->buf + c->len, cap - 1 - c->len);
  if (got < 0 && (errno == EINTR || errno == EAGAIN)) return 0;
  if (got <= 0) return -1;
  char *lf = memchr(c->buf + c->len, '\n', (size_t)got);
  c->len += (size_t)got;
  if (lf) {
    c->len = (size_t)(lf - c->buf);
    return 1;
  }
  return c->len < cap - 1 ? 0 : -2;
}

/* The poll timeout: the nearest deadline, the next cut-off log line, or a
 * second (the loop looks at its signal flags). */
static int qtg_signerd_wait_ms(const qtg_signerd *d, int64_t now) {
  int64_t wait = 1000;
  for (int i = 0; i < QTG_SIGNERD_MAX_CONNS; i++)
    if (d->conns[i].fd >= 0 && d->conns[i].deadline_ms - now < wait) wait = d->conns[i].deadline_ms - now;
  if (d->cut > 0 && d->cut_logged_ms + QTG_SIGNERD_CUT_LOG_MS - now < wait)
    wait = d->cut_logged_ms + QTG_SIGNERD_CUT_LOG_MS - now;
  return wait < 0 ? 0 : (int)wait;
}

/* One turn of the loop: wait for a connection, a request line or the next
 * deadline; read what arrived and decide each whole line, one at a time;
 * cut off the connections past their deadline; accept the pending ones. */
static void qtg_signerd_turn(qtg_signerd *d) {
  struct pollfd p[QTG_SIGNERD_MAX_CONNS + 1];
  int slot[QTG_SIGNERD_MAX_CONNS + 1];
  nfds_t n = 0;
  p[n] = (struct pollfd){.fd = d->listen_fd, .events = POLLIN};
  slot[n++] = -1;
  for (int i = 0; i < QTG_SIGNERD_MAX_CONNS; i++) {
    if (d->conns[i].fd < 0) continue;
    p[n] = (struct pollfd){.fd = d->conns[i].fd, .events = POLLIN};
    slot[n++] = i;
  }
  int ready = poll(p, n, qtg_signerd_wait_ms(d, qtg_signerd_now_ms()));
  int64_t now = qtg_signerd_now_ms();   /* a line in before this is in time */
  for (nfds_t i = 1; ready > 0 && i < n; i++) {
    qtg_signerd_conn *c = &d->conns[slot[i]];
    if (p[i].revents == 0) continue;
    int rc = qtg_signerd_conn_read(c);
    if (rc == 1) {
      qtg_signerd_serve(d, c->fd, &c->peer, c->buf, c->len);
      qtg_signerd_db_settle(d);
    }
    if (rc == 1 || rc == -1) qtg_signerd_conn_close(c);
    else if (rc == -2) qtg_signerd_cut(d, c, 0);
  }
  for (int i = 0; i < QTG_SIGNERD_MAX_CONNS; i++)
    if (d->conns[i].fd >= 0 && d->conns[i].deadline_ms <= now) qtg_signerd_cut(d, &d->conns[i], 0);
  if (ready > 0 && (p[0].revents & POLLIN)) qtg_signerd_accept_some(d);
  qtg_signerd_log_cuts(d, qtg_signerd_now_ms(), 0);
}

/* ---- start-up --------------------------------------------------------------------- */

/* Create the missing directories above path (0700). */
static int qtg_signerd_mkdirs(const char *path, char *err, size_t errlen) {
  char dir[sizeof(((struct sockaddr_un *)0)->sun_path)];
  snprintf(dir, sizeof dir, "%s", path);
  for (char *p = dir + 1; *p; p++) {
    if (*p != '/') continue;
    *p = 0;
    if (mkdir(dir, 0700) != 0 && errno != EEXIST) {
      snprintf(err, errlen, "cannot create %s: %s", dir, strerror(errno));
      return -1;
    }
    *p = '/';
  }
  return 0;
}

static int qtg_signerd_listen(const char *path, char *err, size_t errlen) {
  struct sockaddr_un sa;
  struct stat st;
  if (qtg_signerd_mkdirs(path, err, errlen) != 0) return -1;
  if (lstat(path, &st) == 0) {
    if (!S_ISSOCK(st.st_mode)) {
      snprintf(err, errlen, "%s exists and is not a socket; not touching it", path);
      return -1;
    }
    int probe = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    memset(&sa, 0, sizeof sa);
    sa.sun_family = AF_UNIX;
    snprintf(sa.sun_path, sizeof sa.sun_path, "%s", path);
    int live = probe >= 0 && connect(probe, (struct sockaddr *)&sa, sizeof sa) == 0;
    if (probe >= 0) close(probe);
    if (live) {
      snprintf(err, errlen, "signer socket %s is in use by another running signer", path);
      return -1;
    }
    unlink(path);
  }
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);   /* accept never waits */
  if (fd < 0) {
    snprintf(err, errlen, "socket: %s", strerror(errno));
    return -1;
  }
  memset(&sa, 0, sizeof sa);
  sa.sun_family = AF_UNIX;
  snprintf(sa.sun_path, sizeof sa.sun_path, "%s", path);
  mode_t old = umask(0177);   /* the socket is born 0600 */
  int rc = bind(fd, (struct sockaddr *)&sa, sizeof sa);
  umask(old);
  if (rc != 0 || chmod(path, 0600) != 0 || listen(fd, 64) != 0) {
    snprintf(err, errlen, "cannot listen on %s: %s", path, strerror(errno));
    close(fd);
    return -1;
  }
  return fd;
}

/* Each key must sign a probe that recovers to its own address. */
static int qtg_signerd_self_test(const qtg_keys *k, char *err, size_t errlen) {
  static const char probe[] = "qtg signer start-up probe";
  uint8_t hash[32], addr[20], got[20];
  qtg_signature sig;
  qtg_keccak256(probe, sizeof probe - 1, hash);
  for (size_t i = 0; i < qtg_keys_signer_count(k); i++) {
    const char *name = qtg_keys_signer_name(k, i);
    if (qtg_keys_signer_address(k, name, addr) != 0 ||
        qtg_keys_sign_hash(k, name, hash, &sig) != QTG_SIGNER_OK ||
        qtg_signer_recover(qtg_keys_context(k), hash, &sig, got) != 0 ||
        memcmp(addr, got, 20) != 0) {
      snprintf(err, errlen, "signer key %s fails its start-up probe", name);
      return -1;
    }
  }
  return 0;
}

/* Keys that sign for every class (MG_SIGNER_KEY_CLASSES unset) make the
 * enrolment's lowest quorum the only one that holds: the approvers of a
 * request given the class with the fewest sign a statement the same keys
 * sign for.  So does a tier of one class (not *) that another class does
 * not match for the same amounts (qtg_approvers_uneven).  Such a file is
 * refused, at start and at a reload; keys bound to their classes are the
 * operator's own choice of what each key risks. */
static int qtg_signerd_check_unbound(const qtg_approvers *a, const char *key_classes, size_t nkeys,
                                     char *err, size_t errlen) {
  char why[300];
  if (a == NULL || nkeys == 0 || (key_classes != NULL && key_classes[0] != '\0')) return 0;
  if (!qtg_approvers_uneven(a, why, sizeof why)) return 0;
  snprintf(err, errlen, "MG_SIGNER_APPROVERS %s, and with MG_SIGNER_KEY_CLASSES unset every key "
                        "signs for every class: a request of the class asking fewer gets the same "
                        "keys; bind each key to its classes", why);
  return -1;
}

/* Keys without an enrolment would sign on approval rows that anyone holding
 * the runtime's database login can write: the signer starts so only when
 * MG_SIGNER_TRUST_APPROVAL_ROWS says that is meant.  Both set is a
 * contradiction, refused rather than guessed at. */
static int qtg_signerd_check_approvals(const qtg_signerd *d, int trust_rows, char *err,
                                       size_t errlen) {
  if (d->approvers != NULL && trust_rows) {
    snprintf(err, errlen, "MG_SIGNER_APPROVERS and MG_SIGNER_TRUST_APPROVAL_ROWS=true are both set: "
                          "with an enrolment only signed approvals count; unset one of them");
    return -1;
  }
  if (d->approvers == NULL && !trust_rows && qtg_keys_signer_count(d->keys) > 0) {
    snprintf(err, errlen, "MG_SIGNER_APPROVERS is not set: enrol the approvers (docs/approvals.md, "
                          "\"Signed approvals\"), or set MG_SIGNER_TRUST_APPROVAL_ROWS=true to count the "
                          "approval rows as the daemon's database role writes them (whoever holds that "
                          "login can then approve any transfer)");
    return -1;
  }
  return qtg_signerd_check_unbound(d->approvers, d->key_classes, qtg_keys_signer_count(d->keys),
                                   err, errlen);
}

/* Say at start which keys sign for every class (no MG_SIGNER_KEY_CLASSES)
 * or for none (a key it does not name). */
static void qtg_signerd_warn_unbound(const qtg_signerd *d) {
  size_t n = qtg_keys_signer_count(d->keys);
  if (d->approvers == NULL && n > 0)
    qtg_log_warn("signer: MG_SIGNER_TRUST_APPROVAL_ROWS=true: approvals count as the daemon's "
                 "database role wrote them, unsigned (docs/approvals.md)");
  else if (d->approvers != NULL)
    qtg_log_info("signer: %zu approvers enrolled for deployment %s (MG_SIGNER_APPROVERS): only "
                 "their signed approvals count%s", qtg_approvers_count_persons(d->approvers),
                 qtg_approvers_deployment(d->approvers),
                 qtg_approvers_initiation_signed(d->approvers)
                     ? ", of requests their enrolled maker signed (initiation signed)" : "");
  char zero[256], one[256];
  if (d->approvers != NULL && qtg_approvers_classes_at(d->approvers, 1, one, sizeof one) > 0)
    qtg_log_warn("signer: MG_SIGNER_APPROVERS gives quorum 1 to %s: an enrolled approver who can "
                 "write the daemon's rows (console, runtime login) approves his own request alone; "
                 "where four eyes must hold against such a person, make it 2 (docs/approvals.md)", one);
  if (d->approvers != NULL && qtg_approvers_classes_at(d->approvers, 0, zero, sizeof zero) > 0)
    qtg_log_warn("signer: MG_SIGNER_APPROVERS gives quorum 0 to %s: their transfers are signed with "
                 "no signed approval (the request's approvals_required, which the daemon's role "
                 "writes, is all there is)%s", zero,
                 qtg_approvers_quorum(d->approvers, "*") == 0 && (d->key_classes == NULL || !d->key_classes[0])
                     ? ", and with * at 0 and MG_SIGNER_KEY_CLASSES unset every key signs so for a "
                       "class the file does not name"
                     : "");
  if (n == 0) return;
  if (d->nonce_ahead_max == 0)
    qtg_log_warn("signer: MG_SIGNER_NONCE_AHEAD_MAX=0: a transfer is signed at a nonce any distance "
                 "ahead of the chain, whose bytes can wait for it unseen (docs/security.md)");
  if (d->key_classes == NULL || d->key_classes[0] == '\0') {
    qtg_log_warn("signer: MG_SIGNER_KEY_CLASSES is not set: every key signs for requests of "
                 "every network class");
    return;
  }
  for (size_t i = 0; i < n; i++) {
    const char *name = qtg_keys_signer_name(d->keys, i);
    int named = qtg_signer_classes_name(d->key_classes, name);
    if (!named) qtg_log_warn("signer: key %s is not in MG_SIGNER_KEY_CLASSES: it signs for no network class", name);
  }
}

/* SIGHUP: read the enrolment again, so a revoked approver stops counting
 * without a restart.  A file that cannot be taken now fails closed: the
 * old enrolment is dropped (it may count the person being revoked) and
 * nothing is signed until a reload succeeds. */
static void qtg_signerd_reload_approvers(qtg_signerd *d) {
  char err[512];
  qtg_approvers *fresh = NULL;
  if (d->approvers_path[0] == '\0') {
    qtg_log_info("signer: reload: MG_SIGNER_APPROVERS is not set; nothing to read");
    return;
  }
  if (qtg_approvers_load_guarded(d->approvers_path, d->approvers_writer, &fresh, err, sizeof err) != 0 ||
      qtg_signerd_check_unbound(fresh, d->key_classes, qtg_keys_signer_count(d->keys), err,
                                sizeof err) != 0) {
    qtg_approvers_free(fresh);
    qtg_approvers_free(d->approvers);
    d->approvers = NULL;
    d->approvers_broken = 1;
    qtg_log_error("signer: reload: %s: nothing is signed until the file is fixed and reloaded", err);
    return;
  }
  qtg_approvers_free(d->approvers);
  d->approvers = fresh;
  d->approvers_broken = 0;
  qtg_log_info("signer: reload: the enrolment was read again");
  qtg_signerd_warn_unbound(d);
}

int qtg_signerd_needs_database(const qtg_settings *s) {
  const char *keys = qtg_settings_str(s, QTG_S_SIGNER_KEYS);
  return keys != NULL && keys[0] != '\0';
}

/* A signer holding keys reads the approval record: without a database URL
 * it does not start.  One holding none never connects (d->db_url NULL). */
static int qtg_signerd_attach_db(qtg_signerd *d) {
  if (qtg_keys_signer_count(d->keys) == 0) {
    d->db_url = NULL;
    qtg_log_info("signer: no key (MG_SIGNER_KEYS is not set): nothing to sign; it answers KEYS and "
                 "APPROVALS, refuses SIGN and does not connect to the database");
    return 0;
  }
  if (d->db_url != NULL) return 0;
  qtg_log_error("signer: MG_SIGNER_DATABASE_URL and MG_DATABASE_URL are not set. %s",
                QTG_SIGNERD_DATABASE_HINT);
  return -1;
}

int qtg_signerd_main(const qtg_settings *s, const char *db_url, const char *root_dir) {
  qtg_signerd d;
  char path[sizeof(((struct sockaddr_un *)0)->sun_path)], err[512];
  qtg_keys_config cfg;
  memset(&d, 0, sizeof d);
  memset(&cfg, 0, sizeof cfg);
  for (int i = 0; i < QTG_SIGNERD_MAX_CONNS; i++) d.conns[i].fd = -1;
  d.db_url = db_url && db_url[0] ? db_url : NULL;
  d.db_user = qtg_settings_str(s, QTG_S_SIGNER_DATABASE_USER);
  d.db_tcp_timeout = (int)qtg_settings_num(s, QTG_S_DB_TCP_TIMEOUT_SECONDS);
  d.allowed_uid = (long)qtg_settings_num(s, QTG_S_SIGNER_ALLOWED_UID);
  if (d.allowed_uid < 0) d.allowed_uid = (long)getuid();
  cfg.signer_keys = qtg_settings_str(s, QTG_S_SIGNER_KEYS);
  /* a key file the daemon's uid owns is a key the daemon can read */
  cfg.refuse_signer_key_owner = d.allowed_uid != (long)getuid();
  cfg.signer_key_refused_uid = d.allowed_uid;
  d.key_classes = qtg_settings_str(s, QTG_S_SIGNER_KEY_CLASSES);
  d.nonce_ahead_max = (long)qtg_settings_num(s, QTG_S_SIGNER_NONCE_AHEAD_MAX);
  const char *approvers = qtg_settings_str(s, QTG_S_SIGNER_APPROVERS);
  /* the daemon's uid must not own the enrolment (when it is another uid than ours) */
  long writer = d.allowed_uid != (long)getuid() ? d.allowed_uid : -1;
  d.approvers_path = approvers;
  d.approvers_writer = writer;
  if ((approvers[0] && qtg_approvers_load_guarded(approvers, writer, &d.approvers, err, sizeof err) != 0) ||
      qtg_signer_classes_check(d.key_classes, err, sizeof err) != 0 ||
      qtg_keys_load(&cfg, &d.keys, err, sizeof err) != 0 ||
      qtg_signerd_self_test(d.keys, err, sizeof err) != 0 ||
      qtg_signerd_check_approvals(&d, qtg_settings_bool(s, QTG_S_SIGNER_TRUST_APPROVAL_ROWS), err,
                                  sizeof err) != 0 ||
      qtg_signer_socket_path(s, root_dir, path, sizeof path, err, sizeof err) != 0) {
    qtg_log_error("signer: %s", err);
    qtg_keys_free(d.keys);
    qtg_approvers_free(d.approvers);
    return 1;
  }
  qtg_signerd_warn_unbound(&d);
  if (qtg_signerd_attach_db(&d) != 0) {
    qtg_keys_free(d.keys);
    qtg_approvers_free(d.approvers);
    return 1;
  }
  if (d.db_url != NULL && qtg_signerd_db(&d) == NULL) {
    qtg_log_error("signer: cannot connect to the database as %s",
                  d.db_user && d.db_user[0] ? d.db_user : "the URL's user");
    qtg_keys_free(d.keys);
    qtg_approvers_free(d.approvers);
    return 1;
  }
  d.listen_fd = qtg_signerd_listen(path, err, sizeof err);
  if (d.listen_fd < 0) {
    qtg_log_error("signer: %s", err);
    qtg_signerd_db_drop(&d);
    qtg_keys_free(d.keys);
    qtg_approvers_free(d.approvers);
    return 1;
  }
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = qtg_signerd_on_signal;   /* no SA_RESTART: poll returns EINTR */
  sigaction(SIGTERM, &sa, NULL);
  sigaction(SIGINT, &sa, NULL);
  sigaction(SIGHUP, &sa, NULL);
  signal(SIGPIPE, SIG_IGN);
  char uid[24], ahead[24];
  snprintf(uid, sizeof uid, "%ld", d.allowed_uid);
  snprintf(ahead, sizeof ahead, "%ld", d.nonce_ahead_max);
  const char *f[] = {"socket", path, "allowed_uid", uid, "nonce_ahead_max", ahead, NULL};
  qtg_log_fields(QTG_LOG_INFO, "signer: listening", f);
  qtg_notify_send("READY=1", 7, err, sizeof err);
  while (!qtg_signerd_stop) {
    if (qtg_signerd_hup) {
      qtg_signerd_hup = 0;
      qtg_signerd_reload_approvers(&d);
    }
    qtg_signerd_turn(&d);
  }
  for (int i = 0; i < QTG_SIGNERD_MAX_CONNS; i++) qtg_signerd_conn_close(&d.conns[i]);
  qtg_signerd_log_cuts(&d, qtg_signerd_now_ms(), 1);
  qtg_log_info("signer: stopping");
  close(d.listen_fd);
  unlink(path);
  qtg_signerd_db_drop(&d);
  qtg_keys_free(d.keys);
  qtg_approvers_free(d.approvers);
  return 0;
}
