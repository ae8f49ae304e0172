/* qtg_approvers.h -- the approvers enrolled with the signer, and the
 * statement each of them signs to approve a request.
 *
 * Why: the approval rows (request_approvals) are written by the daemon's
 * database role, so a row alone proves nothing to the signer: whoever runs
 * Lua in `qtgd run` could insert one.  With MG_SIGNER_APPROVERS set, the
 * signer counts an approval only when it carries an Ed25519 signature, by a
 * person enrolled in that file, of the request's approval statement; and it
 * asks for at least the file's quorum for the request's network class,
 * whatever the request row says, raised by the file's amount tiers for
 * large amounts.  The file is the signer's, read at start; the daemon
 * cannot change it.
 *
 * The enrolment file, one entry per line ('#' at the start of a line or
 * after a blank starts a comment; inside a field it is refused):
 *
 *   deployment NAME
 *   person NAME ed25519:HEX64 PRINCIPAL[,PRINCIPAL...]
 *   initiator NAME ed25519:HEX64 PRINCIPAL[,PRINCIPAL...]
 *   initiation signed
 *   quorum CLASS|* N
 *   quorum CLASS|* N above AMOUNT ASSET
 *
 * An initiator is a client system that creates requests: it signs the
 * initiation statement of each request it creates and never counts as an
 * approver.  With `initiation signed`, a request is signed for only when
 * the person or initiator its created_by principal belongs to signed its
 * initiation statement: the maker is then known by a key, not by a row the
 * daemon writes, and never counts as one of its checkers.
 * `deployment NAME` (once, required) names this deployment: every statement
 * signed for it says so, so that an approver who serves two deployments
 * with one key gives a signature that counts in one of them only.
 * A person acts under one or more principals (operator:alice,
 * api:alice-laptop) and counts once however many of them approved.  NAME is
 * [A-Za-z0-9_.-]{1,64}; a principal is KIND:NAME without spaces or commas,
 * at most 128 bytes; a principal or a key belongs to one person only.
 * `quorum CLASS N` (0..100) is the floor for that network class, `quorum *
 * N` for the classes not named; a class with neither is never signed for.
 *
 * A tier, `quorum CLASS|* N above AMOUNT ASSET`, raises the floor to N for
 * a request of that class (any, for *) whose intent's asset is ASSET
 * ([A-Za-z0-9]{1,16}, any case) and whose intent's amount is strictly
 * greater than AMOUNT (a plain decimal: digits, at most one '.' between
 * digits, at most 18 decimals, no sign or exponent; compared exactly, as
 * units of 10^-18).  A request then needs the largest of its class's base
 * quorum, every tier that holds for it, and its approvals_required row.
 * The tiers are the signer's, like the rest of the file: a rule of the
 * daemon's policy that asks more for large amounts binds a compromised
 * daemon only when a tier says it too.  A tier for a class with no quorum
 * (its own or *) is refused, as is a tier given twice (the same class,
 * asset and amount).  A request whose asset a tier of its class names and
 * whose amount does not parse is refused (it may be above).
 *
 * The statements (text, every line ending in "\n"):
 *
 *   qtg-approval-v3 (an approver's), qtg-initiation-v2 (the maker's) or
 *   qtg-attestation-v1 (a person's, that a manual step is done)
 *   deployment NAME (the enrolment's)
 *   request UUID
 *   class NETWORK_CLASS
 *   digest APPROVAL_DIGEST (64 hex: the request's approval document)
 *   plan PLAN_DIGEST (64 hex: the plan version's nodes, the steps right before
 *                     each, and its risk controls: sql/0205)
 *   step NODE_KEY (an attestation's only: the manual step it attests)
 *
 * The request id keeps one approval from approving a twin request (the same
 * intent gives the same digest); the plan digest covers what the request's
 * nodes do (a destination written in a node's config) and in which order
 * (a manual gate before a transfer).
 *
 * Functions return 0 on success and -1 on failure (err filled), unless
 * they say otherwise.
 */
#ifndef QTG_APPROVERS_H
#define QTG_APPROVERS_H

#include <stddef.h>
#include <stdint.h>

enum {
  QTG_APPROVER_NAME_MAX = 64,
  QTG_APPROVER_PRINCIPAL_MAX = 128,
  QTG_APPROVER_QUORUM_MAX = 100,
  QTG_APPROVER_PUBLIC_LEN = 32,
  QTG_APPROVER_SECRET_LEN = 32,
  QTG_APPROVER_SIGNATURE_LEN = 64,
  QTG_APPROVAL_STATEMENT_MAX = 512
};

typedef struct qtg_approvers qtg_approvers;

typedef enum {
  QTG_STATEMENT_APPROVAL = 0,
  QTG_STATEMENT_INITIATION = 1,
  QTG_STATEMENT_ATTESTATION = 2
} qtg_statement_kind;

/* 1 when s (len bytes) is a principal: KIND:NAME, KIND [a-z]+, NAME
 * printable without blanks or commas, at most QTG_APPROVER_PRINCIPAL_MAX
 * bytes in all; else 0. */
int qtg_approvers_principal_ok(const char *s, size_t len);

/* Parse an enrolment file's text. */
int qtg_approvers_parse(const char *text, size_t len, qtg_approvers **out, char *err,
                        size_t errlen);

/* Read and parse the file at path: a regular file that group and others
 * cannot write (the daemon's and the audit tool's reading). */
int qtg_approvers_load(const char *path, qtg_approvers **out, char *err, size_t errlen);

/* The signer's: the same, and refused when the file is owned by
 * writer_uid (the daemon's uid, which could otherwise chmod and rewrite
 * it; writer_uid < 0 checks no owner), unless path is absolute with no
 * link, '.' or '..' on the way, in directories (each up to the root) that
 * only their owner may write, or sticky ones, none owned by writer_uid
 * (which could put another file in its place), and still names the file
 * read. */
int qtg_approvers_load_guarded(const char *path, long writer_uid, qtg_approvers **out, char *err,
                               size_t errlen);

void qtg_approvers_free(qtg_approvers *a);

/* Every enrolled key, persons and initiators (an index below it is an entry). */
size_t qtg_approvers_count(const qtg_approvers *a);

/* The persons alone (those who approve). */
size_t qtg_approvers_count_persons(const qtg_approvers *a);

/* 1 when the file says 'initiation signed'. */
int qtg_approvers_initiation_signed(const qtg_approvers *a);

/* The enrolment's deployment name (never empty in a parsed enrolment). */
const char *qtg_approvers_deployment(const qtg_approvers *a);

/* The SHA-256 of the enrolment's text, 64 lowercase hex digits: two
 * processes that read the same file give the same digest (the daemon's
 * /readyz compares its own with the signer's). */
const char *qtg_approvers_digest(const qtg_approvers *a);

/* The person principal acts for (an index below qtg_approvers_count), or
 * -1 when no enrolled person has it (an initiator's principal included). */
int qtg_approvers_person_of(const qtg_approvers *a, const char *principal);

/* The entry, person or initiator, that principal belongs to, or -1: who
 * signs the initiation of the requests principal creates. */
int qtg_approvers_initiator_of(const qtg_approvers *a, const char *principal);

const char *qtg_approvers_person_name(const qtg_approvers *a, int person);

/* The quorum for klass (its own line, else "*"), or -1 when neither. */
int qtg_approvers_quorum(const qtg_approvers *a, const char *klass);

/* The approvals a request of klass moving amount of asset (the intent's
 * values, as text; NULL when absent) needs at least: the largest of
 * klass's quorum and every tier of klass or "*" for asset whose amount the
 * request's total exceeds.  The total is amount times `transfers`, the
 * plan's evm_transfer nodes (each of which the signer signs for the
 * intent's amount; 0 counts as 1): a plan that pays the amount twice is
 * judged on twice the amount.  why names what decides ("quorum 3 for more
 * than 100 ETH on mainnet", "quorum 2 for mainnet", "quorum 2 for *").  -1
 * with why when klass has no quorum, or when a tier names the class and
 * asset and amount is not a plain decimal of at most 18 decimals (it may
 * be above).  The one rule, for the signer and for the daemon
 * (qtg.approvers). */
int qtg_approvers_quorum_for(const qtg_approvers *a, const char *klass, const char *asset,
                             const char *amount, uint32_t transfers, char *why, size_t whylen);

/* The lowest base quorum and the highest quorum the file gives (its
 * quorum lines, "*" among them; a tier's N counts in the highest, never in
 * the lowest, since it only raises); the number of quorum lines, tiers
 * among them (never 0 in a parsed file). */
size_t qtg_approvers_quorum_range(const qtg_approvers *a, int *lowest, int *highest);

/* The tiers that can raise klass's quorum (its own and those of "*"), each
 * as "quorum 3 for more than 1 ETH on mainnet", joined by "; " into out
 * (truncated to outlen, always terminated); returns how many there are. */
size_t qtg_approvers_tiers_of(const qtg_approvers *a, const char *klass, char *out, size_t outlen);

/* 1 when one request would need fewer approvals under another class than
 * its own, with why ("asks 2 approvals for mainnet but 1 for *", or "asks
 * 3 approvals for more than 1 ETH on mainnet (line 7) but 2 for *"); else
 * 0.  Keys that sign for every class (MG_SIGNER_KEY_CLASSES unset) make
 * the lowest such count the only one that holds, as the daemon names the
 * class.  The base quorums differ, or a tier of a class (not "*") raises
 * it above another class with a quorum line (or *) for some amount: one
 * whose base and tiers for the asset from an amount no higher than the
 * tier's ask fewer.  Tiers of "*" raise every class alike, and differ in
 * nothing. */
int qtg_approvers_uneven(const qtg_approvers *a, char *why, size_t whylen);

/* The classes whose base quorum is `quorum` ("*" among them when it is;
 * tiers aside: they only raise it for large amounts), comma-separated into
 * out (cut to fit); their count.  For the signer's
 * warnings at start: a quorum of 0 needs no signed approval (the request's
 * approvals_required, which the runtime role writes, is then all there
 * is); under a quorum of 1 an enrolled approver who can write the daemon's
 * rows approves his own request alone (the initiator is not in the
 * statement). */
size_t qtg_approvers_classes_at(const qtg_approvers *a, int quorum, char *out, size_t outlen);

/* 1 when sig_hex (128 hex digits) is the Ed25519 signature of msg by entry
 * `person` (a person or an initiator), else 0 (any malformed input
 * included). */
int qtg_approvers_verify(const qtg_approvers *a, int person, const char *msg, size_t len,
                         const char *sig_hex);

/* Write the statement of this kind (an approval or an initiation) for
 * these facts into out; -1 when a fact is not of its form (deployment
 * [A-Za-z0-9_.-]{1,64}, uuid, class [a-z0-9_-]{1,32}, 64 lowercase hex),
 * the kind is an attestation, or out is too small. */
int qtg_request_statement(char *out, size_t outlen, qtg_statement_kind kind, const char *deployment,
                          const char *request, const char *klass, const char *digest,
                          const char *plan);

/* The same for the attestation that the request's manual step `step` (a
 * plan node key, [a-z][a-z0-9_]{0,62}) is done: the facts, then a step
 * line. */
int qtg_attestation_statement(char *out, size_t outlen, const char *deployment, const char *request,
                              const char *klass, const char *digest, const char *plan, const char *step);

/* The statement a person signs to have the signer fill a nonce (a
 * 0-value transfer of sender to itself at nonce on chain: docs/evm.md,
 * "Filling a nonce"):
 *
 *   qtg-fill-v1
 *   deployment NAME
 *   chain CHAIN_ID (decimal, from 1)
 *   sender 0x<40 lowercase hex>
 *   nonce N (decimal, from 0)
 *
 * -1 when a fact is not of its form (decimals of at most 18 digits without
 * a leading zero) or out is too small.  It names no request: a fill moves
 * no money, and the nonce it fills may belong to no request the daemon
 * still shows. */
int qtg_fill_statement(char *out, size_t outlen, const char *deployment, const char *chain,
                       const char *sender, const char *nonce);

/* The kind of statement text (len bytes) is exactly, or -1 when it is
 * not one statement. */
int qtg_request_statement_check(const char *text, size_t len);

/* Ed25519 for an approver's own key (`qtgd approver`): the public key of
 * a 32-byte secret, and a signature of msg. */
int qtg_approver_public_key(const uint8_t secret[QTG_APPROVER_SECRET_LEN],
                            uint8_t pub[QTG_APPROVER_PUBLIC_LEN]);
int qtg_approver_sign(const uint8_t secret[QTG_APPROVER_SECRET_LEN], const char *msg,
                      size_t len, uint8_t sig[QTG_APPROVER_SIGNATURE_LEN]);

#endif
