/* qtg_approver.c -- `qtgd approver`: an approver's own Ed25519 key, on the
 * approver's machine (it needs no database and no daemon).
 *
 *   qtgd approver key FILE     make a key (FILE, mode 0600, new); print the
 *                              public key for the signer's enrolment
 *   qtgd approver public FILE  print FILE's public key again
 *   qtgd approver sign-fill FILE --deployment NAME --chain ID --sender ADDRESS --nonce N
 *                              sign the statement that has qtg's signer
 *                              fill that nonce (a 0-value transfer of the
 *                              sender to itself: docs/evm.md, "Filling a
 *                              nonce"), written from the flags alone (the
 *                              approver's own records: an explorer's view
 *                              of the sender), shown on stderr; print its
 *                              signature (128 hex).  Every flag required.
 *   qtgd approver sign FILE DOCUMENT PLAN | --unchecked  --request UUID
 *                      --kind approval|initiation|attestation [--step KEY]
 *                      [--deployment NAME] [--class NAME]
 *                              read one approval (initiation, attestation)
 *                              statement
 *                              on stdin, show it on stderr, print its
 *                              signature (128 hex);
 *                              with DOCUMENT and PLAN (the API's
 *                              approval_document_text and plan_document_text
 *                              saved to files), sign only when their SHA-256
 *                              are the statement's digest and plan lines, and
 *                              show them: what is signed is then what was
 *                              read, whatever the daemon displayed; then
 *                              what they let qtg's signer sign, by its
 *                              rules (qtg_approver_payments.h);
 *                              only when the statement's request
 *                              (deployment, class) line is the value of
 *                              --request (--deployment, --class), which the
 *                              approver takes from their own records: a
 *                              twin request (the same intent, so the same
 *                              digest) is refused; and only a statement of
 *                              the --kind asked: the same key signs a
 *                              person's approvals and, as a request's
 *                              maker, its initiation, and as a person who
 *                              saw a manual step done, its attestation
 *                              (--step names the step, required then).
 *                              --request and --kind are required: a key
 *                              never signs a request nobody named; so are
 *                              DOCUMENT and PLAN for an approval and an
 *                              initiation, unless --unchecked says to sign
 *                              without them (an attestation, of a request
 *                              approved and frozen, may go without).  The flags go
 *                              anywhere after `sign`; a usage error exits
 *                              2, a refusal 1, neither printing a
 *                              signature.
 *
 * The statement comes from the request (the API's and the console's
 * approval_statement, the initiation_statement its maker signs (a client
 * system's key is used the same way), or a manual node's
 * attestation_statement); docs/approvals.md says how to check it before
 * signing.  A statement of any other shape is refused, so the key signs
 * these statements only.  Every kind has the same deployment, request and
 * class lines, and the flags confirm them alike.
 */
#include "qtg_approver.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <openssl/crypto.h>

#include "qtg_approver_payments.h"
#include "qtg_approvers.h"
#include "qtg_crypto.h"
#include "qtg_keys.h"
#include "qtg_signer.h"

static const char qtg_approver_usage[] =
    "usage: qtgd approver key FILE | public FILE\n"
    "       qtgd approver sign-fill FILE --deployment NAME --chain ID --sender ADDRESS --nonce N\n"
    "       qtgd approver sign FILE DOCUMENT PLAN --request UUID\n"
    "                          --kind approval|initiation|attestation [--step KEY]\n"
    "                          [--deployment NAME] [--class NAME] < statement\n"
    "       qtgd approver sign FILE --unchecked --request UUID --kind ... < statement\n"
    "  --request UUID    (required) sign only if the statement is for this request\n"
    "                    (the id from your own records, not from the statement: a\n"
    "                    lowercase uuid)\n"
    "  --kind approval|initiation|attestation\n"
    "                    (required) sign only a statement of this kind\n"
    "  --step KEY        (required with --kind attestation) sign only the attestation\n"
    "                    of this manual step\n"
    "  --deployment NAME, --class NAME\n"
    "                    sign only if the statement names this deployment, this class\n"
    "  DOCUMENT PLAN     the texts the statement's digest and plan lines hash: signed\n"
    "                    only if they do, after showing what the signer may pay from\n"
    "                    them (required for an approval or an initiation)\n"
    "  --unchecked       sign without DOCUMENT and PLAN: the digest and plan lines\n"
    "                    are then checked against nothing you have read\n";

enum { QTG_APPROVER_TEXT_MAX = 1 << 20 };

/* Read a whole file of at most QTG_APPROVER_TEXT_MAX bytes; NULL on error
 * (said on stderr).  The caller frees. */
static char *qtg_approver_read_text(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  if (f == NULL) {
    fprintf(stderr, "qtgd approver: cannot open %s: %s\n", path, strerror(errno));
    return NULL;
  }
  char *buf = malloc(QTG_APPROVER_TEXT_MAX + 1);
  size_t n = buf ? fread(buf, 1, QTG_APPROVER_TEXT_MAX + 1, f) : 0;
  int bad = buf == NULL || ferror(f) || n > QTG_APPROVER_TEXT_MAX;
  fclose(f);
  if (bad) {
    fprintf(stderr, "qtgd approver: cannot read %s (at most %d bytes)\n", path, QTG_APPROVER_TEXT_MAX);
    free(buf);
    return NULL;
  }
  buf[n] = '\0';
  *len = n;
  return buf;
}

/* The length of the UTF-8 sequence at p (at most n bytes) and its code
 * point, or 0 when it is not one (overlong, a surrogate, above U+10FFFF). */
static size_t qtg_utf8_next(const unsigned char *p, size_t n, unsigned long *cp) {
  size_t len = p[0] >= 0xf0 && p[0] <= 0xf4 ? 4 : p[0] >= 0xe0 ? 3 : p[0] >= 0xc2 && p[0] <= 0xdf ? 2 : 0;
  if (len == 0 || len > n || (len == 3 && p[0] > 0xef)) return 0;
  unsigned long c = p[0] & (0x7f >> len);
  for (size_t i = 1; i < len; i++) {
    if ((p[i] & 0xc0) != 0x80) return 0;
    c = (c << 6) | (p[i] & 0x3f);
  }
  if ((len == 3 && c < 0x800) || (len == 4 && (c < 0x10000 || c > 0x10ffff)) ||
      (c >= 0xd800 && c <= 0xdfff))
    return 0;
  *cp = c;
  return len;
}

/* Write text to stderr as it would be read, nothing hidden: printable
 * ASCII (and, unless inline, newlines and tabs) as they are, every other
 * character as a JSON escape (\uXXXX, a surrogate pair above U+FFFF: a
 * zero-width space or a look-alike letter in a key shows as what it is), a
 * byte that is no UTF-8 as \xNN.  jsonb text escapes control characters
 * itself, not the rest.  Returns how many characters it escaped. */
static size_t qtg_approver_escape(const char *text, size_t len, int inline_text) {
  const unsigned char *p = (const unsigned char *)text;
  size_t escaped = 0;
  for (size_t i = 0; i < len;) {
    unsigned long c;
    size_t n;
    if ((p[i] >= 0x20 && p[i] < 0x7f) || (!inline_text && (p[i] == '\n' || p[i] == '\t'))) {
      fputc(p[i], stderr);
      i++;
      continue;
    }
    escaped++;
    if (p[i] >= 0x80 && (n = qtg_utf8_next(p + i, len - i, &c)) > 0) {
      if (c > 0xffff)
        fprintf(stderr, "\\u%04lx\\u%04lx", 0xd800 + ((c - 0x10000) >> 10), 0xdc00 + ((c - 0x10000) & 0x3ff));
      else
        fprintf(stderr, "\\u%04lx", c);
      i += n;
    } else {
      fprintf(stderr, "\\x%02x", p[i]);
      i++;
    }
  }
  return escaped;
}

/* Show a text (a document) on stderr, escaped, and say so when it was. */
static void qtg_approver_show(const char *text, size_t len) {
  size_t escaped = qtg_approver_escape(text, len, 0);
  fputc('\n', stderr);
  if (escaped > 0)
    fprintf(stderr, "(%zu characters outside printable ASCII are shown escaped, as above)\n", escaped);
}

/* 0 when the SHA-256 of the file at path is the hex after "\nWORD " in the
 * statement, with the file's text in *out (the caller frees); shows it on
 * stderr. */
static int qtg_approver_check_text(const char *statement, const char *word, const char *path, char **out,
                                   size_t *out_len) {
  char want[80], hex[2 * QTG_SHA256_LEN + 1];
  uint8_t digest[QTG_SHA256_LEN];
  size_t len = 0;
  snprintf(want, sizeof want, "\n%s ", word);
  const char *at = strstr(statement, want);
  char *text = qtg_approver_read_text(path, &len);
  if (text == NULL) return -1;
  int ok = at != NULL && qtg_sha256(text, len, digest) == 0;
  if (ok) {
    qtg_hex_encode(digest, sizeof digest, hex);
    ok = strncmp(at + strlen(want), hex, 2 * QTG_SHA256_LEN) == 0;
  }
  if (!ok) {
    fprintf(stderr, "qtgd approver: %s is not what the statement's %s line covers: not signed\n", path, word);
    free(text);
    return -1;
  }
  fprintf(stderr, "%s (%s):\n", word, path);
  qtg_approver_show(text, len);
  *out = text;
  *out_len = len;
  return 0;
}

/* Show what the two texts let the signer sign (qtg_approver_payments.h);
 * -1 when they cannot be read so (said on stderr): nothing is signed that
 * the approver cannot be shown. */
static int qtg_approver_show_payments(const char *document, size_t document_len, const char *plan,
                                      size_t plan_len) {
  char err[256];
  char *text = qtg_approver_payments(document, document_len, plan, plan_len, err, sizeof err);
  if (text == NULL) {
    fputs("qtgd approver: ", stderr);
    qtg_approver_escape(err, strlen(err), 1);
    fputs(": not signed\n", stderr);
    return -1;
  }
  qtg_approver_show(text, strlen(text));
  free(text);
  return 0;
}

/* With DOCUMENT and PLAN: both are what the statement hashes, shown, and
 * what they let the signer sign shown after them. */
static int qtg_approver_check_texts(const char *statement, const char *document_path, const char *plan_path) {
  char *document = NULL, *plan = NULL;
  size_t document_len = 0, plan_len = 0;
  int bad = qtg_approver_check_text(statement, "digest", document_path, &document, &document_len) != 0 ||
            qtg_approver_check_text(statement, "plan", plan_path, &plan, &plan_len) != 0 ||
            qtg_approver_show_payments(document, document_len, plan, plan_len) != 0;
  free(document);
  free(plan);
  return bad ? -1 : 0;
}

static int qtg_approver_print_public(const uint8_t secret[QTG_APPROVER_SECRET_LEN]) {
  uint8_t pub[QTG_APPROVER_PUBLIC_LEN];
  char hex[2 * QTG_APPROVER_PUBLIC_LEN + 1];
  if (qtg_approver_public_key(secret, pub) != 0) {
    fprintf(stderr, "qtgd approver: cannot derive the public key\n");
    return 1;
  }
  qtg_hex_encode(pub, sizeof pub, hex);
  printf("ed25519:%s\n", hex);
  return 0;
}

static int qtg_approver_new_key(const char *path) {
  uint8_t secret[QTG_APPROVER_SECRET_LEN];
  char hex[2 * QTG_APPROVER_SECRET_LEN + 2];
  int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0) {
    fprintf(stderr, "qtgd approver: cannot create %s: %s\n", path, strerror(errno));
    return 1;
  }
  if (qtg_random_bytes(secret, sizeof secret) != 0) {
    fprintf(stderr, "qtgd approver: no randomness\n");
    close(fd);
    unlink(path);
    return 1;
  }
  qtg_hex_encode(secret, sizeof secret, hex);
  hex[2 * QTG_APPROVER_SECRET_LEN] = '\n';
  ssize_t n = write(fd, hex, sizeof hex - 1);
  int closed = close(fd);
  OPENSSL_cleanse(hex, sizeof hex);
  if (n != (ssize_t)(sizeof hex - 1) || closed != 0) {
    fprintf(stderr, "qtgd approver: cannot write %s\n", path);
    unlink(path);
    OPENSSL_cleanse(secret, sizeof secret);
    return 1;
  }
  int rc = qtg_approver_print_public(secret);
  OPENSSL_cleanse(secret, sizeof secret);
  return rc;
}

/* The statement's lines an approver can confirm with a flag of the same
 * name (--deployment, --request, --class: the same in every kind; --step:
 * an attestation's only). */
enum { QTG_CONFIRM_DEPLOYMENT, QTG_CONFIRM_REQUEST, QTG_CONFIRM_CLASS, QTG_CONFIRM_STEP, QTG_CONFIRM_LINES };
static const char *const qtg_confirm_word[QTG_CONFIRM_LINES] = {"deployment", "request", "class", "step"};
static const char *const qtg_statement_kind_name[] = {"approval", "initiation", "attestation"};
enum { QTG_STATEMENT_KINDS = 3 };
static const char *const qtg_confirm_form[QTG_CONFIRM_LINES] = {
    "--deployment takes a name ([A-Za-z0-9_.-], at most 64), not",
    "--request takes a lowercase uuid (8-4-4-4-12 hex digits), not",
    "--class takes a network class ([a-z0-9_-], at most 32), not",
    "--step takes a plan node key ([a-z][a-z0-9_], at most 63), not"};

/* What `sign` was given: the key, the two texts (or NULL), and the value
 * of each confirming flag (NULL when not given). */
typedef struct {
  const char *key, *document, *plan;
  const char *expect[QTG_CONFIRM_LINES];
  int kind;                     /* --kind: the statement kind, -1 when not given */
  int unchecked;                /* --unchecked: no DOCUMENT and PLAN */
} qtg_approver_sign_args;

/* 0 when value is of the form of line `which` in a statement (a uuid in
 * lowercase for the request): qtg_request_statement builds one with value
 * there and a well-formed placeholder everywhere else. */
static int qtg_confirm_value_ok(int which, const char *value) {
  static const char zero_uuid[] = "00000000-0000-0000-0000-000000000000";
  char hex[65], out[QTG_APPROVAL_STATEMENT_MAX];
  memset(hex, '0', 64);
  hex[64] = '\0';
  return qtg_attestation_statement(out, sizeof out, which == QTG_CONFIRM_DEPLOYMENT ? value : "x",
                                   which == QTG_CONFIRM_REQUEST ? value : zero_uuid,
                                   which == QTG_CONFIRM_CLASS ? value : "x", hex, hex,
                                   which == QTG_CONFIRM_STEP ? value : "x");
}

static int qtg_approver_usage_error(const char *what, const char *arg) {
  fprintf(stderr, "qtgd approver: %s", what);
  if (arg != NULL) {
    fputs(" '", stderr);
    qtg_approver_escape(arg, strlen(arg), 1);
    fputc('\'', stderr);
  }
  fputc('\n', stderr);
  fputs(qtg_approver_usage, stderr);
  return -1;
}

/* --kind approval|initiation|attestation into args->kind. */
static int qtg_approver_kind_flag(const char *flag, const char *value, qtg_approver_sign_args *args) {
  if (args->kind >= 0) return qtg_approver_usage_error("given twice:", flag);
  for (int k = 0; k < QTG_STATEMENT_KINDS; k++)
    if (strcmp(value, qtg_statement_kind_name[k]) == 0) args->kind = k;
  if (args->kind < 0)
    return qtg_approver_usage_error("--kind takes approval, initiation or attestation, not", value);
  return 0;
}

/* One --WORD VALUE at argv[*i] into args; -1 (usage said) when WORD is
 * none of the lines, or the value is missing, given twice or malformed. */
static int qtg_approver_sign_flag(int argc, char **argv, int *i, qtg_approver_sign_args *args) {
  const char *flag = argv[*i];
  int which = -1;
  if (strcmp(flag, "--unchecked") == 0) {
    if (args->unchecked) return qtg_approver_usage_error("given twice:", flag);
    args->unchecked = 1;
    return 0;
  }
  if (strcmp(flag, "--kind") == 0) {
    if (*i + 1 >= argc || strncmp(argv[*i + 1], "--", 2) == 0)
      return qtg_approver_usage_error("a value is missing after", flag);
    return qtg_approver_kind_flag(flag, argv[++*i], args);
  }
  for (int w = 0; w < QTG_CONFIRM_LINES; w++)
    if (strncmp(flag, "--", 2) == 0 && strcmp(flag + 2, qtg_confirm_word[w]) == 0) which = w;
  if (which < 0) return qtg_approver_usage_error("unknown option", flag);
  if (*i + 1 >= argc || strncmp(argv[*i + 1], "--", 2) == 0)
    return qtg_approver_usage_error("a value is missing after", flag);
  if (args->expect[which] != NULL) return qtg_approver_usage_error("given twice:", flag);
  const char *value = argv[++*i];
  if (qtg_confirm_value_ok(which, value) != 0) return qtg_approver_usage_error(qtg_confirm_form[which], value);
  args->expect[which] = value;
  return 0;
}

/* Parse `sign`'s arguments (argv[0] is "sign"): FILE [DOCUMENT PLAN] and
 * the flags, in any order, --request and --kind among them.  -1 (usage
 * said) on anything else. */
static int qtg_approver_sign_parse(int argc, char **argv, qtg_approver_sign_args *args) {
  const char *pos[3];
  int npos = 0;
  memset(args, 0, sizeof *args);
  args->kind = -1;
  for (int i = 1; i < argc; i++) {
    if (argv[i][0] == '-' && argv[i][1] != '\0') {
      if (qtg_approver_sign_flag(argc, argv, &i, args) != 0) return -1;
    } else if (npos == 3) {
      return qtg_approver_usage_error("too many arguments at", argv[i]);
    } else {
      pos[npos++] = argv[i];
    }
  }
  if (npos != 1 && npos != 3)
    return qtg_approver_usage_error(npos == 0 ? "sign needs a key FILE" : "DOCUMENT needs its PLAN", NULL);
  if (args->expect[QTG_CONFIRM_REQUEST] == NULL)
    return qtg_approver_usage_error("sign needs --request UUID: the request's id from your own records "
                                    "(its ticket), which the statement must name", NULL);
  if (args->kind < 0)
    return qtg_approver_usage_error("sign needs --kind approval, initiation or attestation: which statement "
                                    "you mean to sign", NULL);
  if ((args->kind == QTG_STATEMENT_ATTESTATION) != (args->expect[QTG_CONFIRM_STEP] != NULL))
    return qtg_approver_usage_error(args->kind == QTG_STATEMENT_ATTESTATION
                                        ? "an attestation needs --step KEY: the manual step you attest, "
                                          "from your own records"
                                        : "--step is an attestation's: only --kind attestation takes it",
                                    NULL);
  /* The texts are what binds the statement's digest and plan lines to what
   * the approver read: a daemon can rewrite a pending request and hand out
   * its new statement with the old request line. */
  if (npos == 3 && args->unchecked)
    return qtg_approver_usage_error("--unchecked is for signing without DOCUMENT and PLAN, and both were given",
                                    NULL);
  if (npos == 1 && !args->unchecked && args->kind != QTG_STATEMENT_ATTESTATION)
    return qtg_approver_usage_error(args->kind == QTG_STATEMENT_APPROVAL
                                        ? "an approval needs its DOCUMENT and PLAN texts, which the statement's "
                                          "digest and plan lines must hash (or --unchecked)"
                                        : "an initiation needs its DOCUMENT and PLAN texts, which the statement's "
                                          "digest and plan lines must hash (or --unchecked)",
                                    NULL);
  args->key = pos[0];
  args->document = npos == 3 ? pos[1] : NULL;
  args->plan = npos == 3 ? pos[2] : NULL;
  return 0;
}

/* The value of the statement's "WORD " line and its length (text: one
 * checked statement, NUL-terminated, so the line is there). */
static const char *qtg_statement_line(const char *text, const char *word, size_t *len) {
  char want[32];
  int n = snprintf(want, sizeof want, "\n%s ", word);
  const char *at = n > 0 && (size_t)n < sizeof want ? strstr(text, want) : NULL;
  if (at == NULL) {
    *len = 0;
    return "";
  }
  at += n;
  *len = strcspn(at, "\n");
  return at;
}

/* 0 when every line a flag confirms is that flag's value; otherwise say on
 * stderr each line that differs (both values, escaped) and -1. */
static int qtg_approver_confirm(const char *text, const char *const expect[QTG_CONFIRM_LINES]) {
  int differs = 0;
  for (int w = 0; w < QTG_CONFIRM_LINES; w++) {
    size_t len;
    const char *got = qtg_statement_line(text, qtg_confirm_word[w], &len);
    if (expect[w] == NULL || (strlen(expect[w]) == len && memcmp(got, expect[w], len) == 0)) continue;
    fprintf(stderr, "qtgd approver: the statement's %s line is not the one given with --%s\n"
                    "  statement: %s ", qtg_confirm_word[w], qtg_confirm_word[w], qtg_confirm_word[w]);
    qtg_approver_escape(got, len, 1);
    fprintf(stderr, "\n  expected:  %s ", qtg_confirm_word[w]);
    qtg_approver_escape(expect[w], strlen(expect[w]), 1);
    fputc('\n', stderr);
    differs++;
  }
  if (differs == 0) return 0;
  fputs("qtgd approver: not signed: this statement is not for the request (or the step) you confirmed "
        "(a twin request has the same digest and another request line)\n", stderr);
  return -1;
}

/* The last line on stderr: which request the signature is for, and which
 * of its lines the flags confirmed. */
static void qtg_approver_summary(const char *text, int kind, const qtg_approver_sign_args *args) {
  static const int order[QTG_CONFIRM_LINES] = {QTG_CONFIRM_STEP, QTG_CONFIRM_REQUEST, QTG_CONFIRM_CLASS,
                                               QTG_CONFIRM_DEPLOYMENT};
  const char *const *expect = args->expect;
  fprintf(stderr, "==> %s statement (confirmed; digest and plan %s) for", qtg_statement_kind_name[kind],
          args->document != NULL ? "checked against their texts" : "NOT checked against any text");
  for (int i = kind == QTG_STATEMENT_ATTESTATION ? 0 : 1; i < QTG_CONFIRM_LINES; i++) {
    size_t len;
    const char *got = qtg_statement_line(text, qtg_confirm_word[order[i]], &len);
    fprintf(stderr, "%s %s ", i == 0 || (i == 1 && kind != QTG_STATEMENT_ATTESTATION) ? "" : ",",
            qtg_confirm_word[order[i]]);
    qtg_approver_escape(got, len, 1);
    if (expect[order[i]] != NULL) fputs(" (confirmed)", stderr);
  }
  fputc('\n', stderr);
}

/* Sign a statement (text, checked): stderr shows what is signed, stdout
 * gets the signature (128 hex).  The exit code. */
static int qtg_approver_print_signed(const uint8_t secret[QTG_APPROVER_SECRET_LEN], const char *text) {
  uint8_t sig[QTG_APPROVER_SIGNATURE_LEN];
  char hex[2 * QTG_APPROVER_SIGNATURE_LEN + 1];
  if (qtg_approver_sign(secret, text, strlen(text), sig) != 0) {
    fprintf(stderr, "qtgd approver: signing failed\n");
    return 1;
  }
  qtg_hex_encode(sig, sizeof sig, hex);
  fprintf(stderr, "signed:\n%s", text);
  if (printf("%s\n", hex) < 0 || fflush(stdout) != 0) {
    fprintf(stderr, "qtgd approver: cannot write the signature: %s\n", strerror(errno));
    return 1;
  }
  return 0;
}

static int qtg_approver_sign_stdin(const uint8_t secret[QTG_APPROVER_SECRET_LEN],
                                   const qtg_approver_sign_args *args) {
  char text[QTG_APPROVAL_STATEMENT_MAX + 1];
  size_t len = 0;
  for (;;) {
    if (len == sizeof text) {
      fprintf(stderr, "qtgd approver: the statement is longer than %d bytes\n",
              QTG_APPROVAL_STATEMENT_MAX);
      return 1;
    }
    ssize_t n = read(STDIN_FILENO, text + len, sizeof text - len);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      fprintf(stderr, "qtgd approver: reading the statement: %s\n", strerror(errno));
      return 1;
    }
    if (n == 0) break;
    len += (size_t)n;
  }
  int kind = qtg_request_statement_check(text, len);
  if (kind < 0) {
    fprintf(stderr, "qtgd approver: stdin is not one approval, initiation or attestation statement "
                    "(qtg-approval-v3, qtg-initiation-v2 or qtg-attestation-v1, then deployment, request, "
                    "class, digest and plan lines, and an attestation's step line)\n");
    return 1;
  }
  text[len] = '\0';
  if (args->kind != kind) {
    fprintf(stderr, "qtgd approver: not signed: this is an %s statement, and --kind says %s\n",
            qtg_statement_kind_name[kind], qtg_statement_kind_name[args->kind]);
    return 1;
  }
  if (qtg_approver_confirm(text, args->expect) != 0) return 1;
  if (args->document != NULL && qtg_approver_check_texts(text, args->document, args->plan) != 0) return 1;
  if (qtg_approver_print_signed(secret, text) != 0) return 1;
  qtg_approver_summary(text, kind, args);
  return 0;
}

static int qtg_approver_sign_main(int argc, char **argv) {
  qtg_approver_sign_args args;
  if (qtg_approver_sign_parse(argc, argv, &args) != 0) return 2;
  uint8_t secret[QTG_APPROVER_SECRET_LEN];
  char err[512];
  if (qtg_keys_read_secret("qtgd approver", args.key, secret, err, sizeof err) != 0) {
    fprintf(stderr, "%s\n", err);
    return 1;
  }
  int rc = qtg_approver_sign_stdin(secret, &args);
  OPENSSL_cleanse(secret, sizeof secret);
  return rc;
}

/* sign-fill FILE --deployment NAME --chain ID --sender ADDRESS --nonce N */
static int qtg_approver_sign_fill_main(int argc, char **argv) {
  static const char *const flag[] = {"--deployment", "--chain", "--sender", "--nonce"};
  static const char *const form[] = {
      "--deployment takes a name ([A-Za-z0-9_.-], at most 64), not",
      "--chain takes a chain id (a decimal from 1, no leading zero, at most 18 digits), not",
      "--sender takes 0x and 40 hex digits, not",
      "--nonce takes a nonce (a decimal from 0, no leading zero, at most 18 digits), not"};
  /* a value known good for each fact, to try one given value at a time */
  const char *good[4] = {"d", "1", "0x0000000000000000000000000000000000000000", "0"};
  const char *value[4] = {NULL, NULL, NULL, NULL}, *key = NULL;
  char sender[43], text[QTG_APPROVAL_STATEMENT_MAX];
  for (int i = 1; i < argc; i++) {
    int which = -1;
    for (int f = 0; f < 4; f++)
      if (strcmp(argv[i], flag[f]) == 0) which = f;
    if (which < 0 && argv[i][0] == '-') return qtg_approver_usage_error("unknown option", argv[i]), 2;
    if (which < 0) {
      if (key != NULL) return qtg_approver_usage_error("too many arguments at", argv[i]), 2;
      key = argv[i];
      continue;
    }
    if (i + 1 >= argc || strncmp(argv[i + 1], "--", 2) == 0)
      return qtg_approver_usage_error("a value is missing after", argv[i]), 2;
    if (value[which] != NULL) return qtg_approver_usage_error("given twice:", argv[i]), 2;
    value[which] = argv[++i];
  }
  if (key == NULL) return qtg_approver_usage_error("sign-fill needs a key FILE", NULL), 2;
  for (int f = 0; f < 4; f++)
    if (value[f] == NULL) return qtg_approver_usage_error("sign-fill needs", flag[f]), 2;
  /* the address as the signer writes it: lowercase */
  snprintf(sender, sizeof sender, "%s", value[2]);
  for (char *c = sender; *c; c++)
    if (*c >= 'A' && *c <= 'F') *c = (char)(*c - 'A' + 'a');
  if (strlen(value[2]) == 42 && sender[1] == 'X') sender[1] = 'x';
  /* mixed case is an EIP-55 checksum, and a typo in it is refused */
  uint8_t addr[QTG_ADDRESS_LEN];
  char summed[43];
  int upper = 0, lower = 0;
  for (const char *c = value[2] + (strlen(value[2]) > 2 ? 2 : 0); *c; c++) {
    upper |= *c >= 'A' && *c <= 'F';
    lower |= *c >= 'a' && *c <= 'f';
  }
  if (upper && lower &&
      (qtg_signer_parse_address(value[2], strlen(value[2]), addr) != 0 ||
       (qtg_signer_checksum_address(addr, summed), strcmp(summed + 2, value[2] + 2) != 0)))
    return qtg_approver_usage_error("--sender fails its EIP-55 checksum:", value[2]), 2;
  const char *given[4] = {value[0], value[1], strlen(value[2]) == 42 ? sender : value[2], value[3]};
  for (int f = 0; f < 4; f++) {
    const char *one[4] = {good[0], good[1], good[2], good[3]};
    one[f] = given[f];
    if (qtg_fill_statement(text, sizeof text, one[0], one[1], one[2], one[3]) != 0)
      return qtg_approver_usage_error(form[f], value[f]), 2;
  }
  if (qtg_fill_statement(text, sizeof text, given[0], given[1], given[2], given[3]) != 0)
    return qtg_approver_usage_error("not a fill statement:", value[0]), 2;
  uint8_t secret[QTG_APPROVER_SECRET_LEN];
  char err[512];
  if (qtg_keys_read_secret("qtgd approver", key, secret, err, sizeof err) != 0) {
    fprintf(stderr, "%s\n", err);
    return 1;
  }
  int rc = qtg_approver_print_signed(secret, text);
  OPENSSL_cleanse(secret, sizeof secret);
  if (rc == 0)
    fprintf(stderr, "==> fill of nonce %s of %s on chain %s: a transfer of nothing to itself, which uses that "
                    "nonce up once it is mined (a transaction signed at it then never is)\n", given[3], given[2],
            given[1]);
  return rc;
}

int qtg_approver_main(int argc, char **argv) {
  if (argc >= 1 && strcmp(argv[0], "sign") == 0) return qtg_approver_sign_main(argc, argv);
  if (argc >= 1 && strcmp(argv[0], "sign-fill") == 0) return qtg_approver_sign_fill_main(argc, argv);
  if (argc != 2 || (strcmp(argv[0], "key") != 0 && strcmp(argv[0], "public") != 0)) {
    fputs(qtg_approver_usage, stderr);
    return 2;
  }
  if (strcmp(argv[0], "key") == 0) return qtg_approver_new_key(argv[1]);
  uint8_t secret[QTG_APPROVER_SECRET_LEN];
  char err[512];
  if (qtg_keys_read_secret("qtgd approver", argv[1], secret, err, sizeof err) != 0) {
    fprintf(stderr, "%s\n", err);
    return 1;
  }
  int rc = qtg_approver_print_public(secret);
  OPENSSL_cleanse(secret, sizeof secret);
  return rc;
}
