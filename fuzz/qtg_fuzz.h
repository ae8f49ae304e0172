/* qtg_fuzz.h -- the fuzz targets: the C parts of qtgd that parse input from
 * outside the process, each behind one entry point that libFuzzer drives
 * (fuzz/libfuzzer_main.c, built with -DQTG_FUZZ=ON by cmake/fuzz.cmake) and
 * that the plain build replays over fuzz/corpus/<target>/ as a ctest
 * (spec/c/test_fuzz_regressions.c).
 *
 * Each entry point takes one input, runs it through the real code, checks
 * the properties written above it, and returns 0, or -1 after printing why
 * to stderr (libFuzzer's wrapper then aborts, so the input is saved as a
 * crash; the regression test counts it as a failure).  Crashes, leaks and
 * undefined behaviour are the sanitizers' to report.
 *
 *   settings  MG_* settings and the keys they name (qtg_settings_load,
 *             qtg_keys_load): never a crash, and no error message quotes a
 *             key's bytes
 *   json      the JSON boundary: cjson.decode of any bytes and qtg.canon_json
 *             on what it gives (canonical form is stable), the JSON-lines
 *             logger (every line is one valid JSON object whatever its text),
 *             and canon_json's strict syntax check (passes nothing a strict
 *             cjson refuses)
 *   console   the console's wire format, bytes sent to a live console server
 *             (qtg_console_session.c): one final frame per command, a fatal
 *             frame for a malformed one, and the session always ends
 *   http      raw bytes answered by a real socket to qtg.http.request: a
 *             response or a classified error in Lua, bounded by max_body,
 *             and never a hang
 *   signer    the request line `qtgd signer` reads, the EIP-1559 payload
 *             it decodes and MG_SIGNER_KEY_CLASSES (qtg_signer_proto.c),
 *             the MG_SIGNER_APPROVERS enrolment and the approval statement
 *             (qtg_approvers.c): strict fields, canonical RLP, no key
 *             serving a class the setting does not give it, a refused
 *             enrolment with a reason, a statement in its one form only
 *   pg        the after-commit notification PostgreSQL sends a pool session
 *             as a NOTICE (qtg_pg_after_commit_parse): taken exactly when it
 *             has the prefix, a channel and a space, the parts in place
 *   approver  the two texts `qtgd approver sign KEY DOCUMENT PLAN` reads and
 *             describes by the signer's rules (qtg_approver_payments.c): a
 *             description under its heading, or a refusal with a reason
 */
#ifndef QTG_FUZZ_H
#define QTG_FUZZ_H

#include <stddef.h>
#include <stdint.h>

int qtg_fuzz_settings(const uint8_t *data, size_t size);
int qtg_fuzz_json(const uint8_t *data, size_t size);
int qtg_fuzz_console(const uint8_t *data, size_t size);
int qtg_fuzz_http(const uint8_t *data, size_t size);
int qtg_fuzz_signer(const uint8_t *data, size_t size);
int qtg_fuzz_approver(const uint8_t *data, size_t size);
int qtg_fuzz_pg(const uint8_t *data, size_t size);

/* The shared host of the console and http targets (fuzz/fuzz_host.c):
 * made on first use, closed at exit (or by qtg_fuzz_host_close). */
struct qtg_host;
struct qtg_host *qtg_fuzz_host(void);
void qtg_fuzz_host_close(void);
/* Where lua/ is: $QTG_ROOT, else the source tree. */
const char *qtg_fuzz_root(void);

#endif
