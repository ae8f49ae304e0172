/* qtg_approver.c -- `qtgd approver`: an approver's own Ed25519 key, on the
 * approver's machine (it needs no database and no daemon).
 *
 *   qtgd approver key FILE     make a key (FILE, mode 0600, new); print the
 *                              public key for the signer's enrolment
 *   qtgd approver public FILE  print FILE's public key again
 *   qtgd approver sign FILE [DOCUMENT PLAN]
 *                              read one approval (or initiation) statement
 *                              on stdin, show
 *                              it on stderr, print its signature (128 hex);
 *                              with DOCUMENT and PLAN (the API's
 *                              approval_document_text and plan_document_text
 *                              saved to files), sign only when their SHA-256
 *                              are the statement's digest and plan lines, and
 *                              show them: what is signed is then what was
 *                              read, whatever the daemon displayed
 *
 * The statement comes from the request (the API's and the console's
 * approval_statement, or the initiation_statement its maker signs: a
 * client system's key is used the same way); docs/approvals.md says how to
 * check it before signing.  A statement of any other shape is refused, so
 * the key signs these statements only.
 */
#include "qtg_approver.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <openssl/crypto.h>

#include "qtg_approvers.h"
#include "qtg_crypto.h"
#include "qtg_keys.h"

static const char qtg_approver_usage[] =
    "usage: qtgd approver key FILE | public FILE | sign FILE [DOCUMENT PLAN] < statement\n";

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

/* Show text on stderr as it would be read, nothing hidden: printable ASCII,
 * newlines and tabs as they are, every other character as a JSON escape
 * (\uXXXX, a surrogate pair above U+FFFF: a zero-width space or a
 * look-alike letter in a key shows as what it is), a byte that is no UTF-8
 * as \xNN.  jsonb text escapes control characters itself, not the rest. */
static void qtg_approver_show(const char *text, size_t len) {
  const unsigned char *p = (const unsigned char *)text;
  size_t escaped = 0;
  for (size_t i = 0; i < len;) {
    unsigned long c;
    size_t n;
    if ((p[i] >= 0x20 && p[i] < 0x7f) || p[i] == '\n' || p[i] == '\t') {
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
  fputc('\n', stderr);
  if (escaped > 0)
    fprintf(stderr, "(%zu characters outside printable ASCII are shown escaped, as above)\n", escaped);
}

/* 0 when the SHA-256 of the file at path is the hex after "\nWORD " in the
 * statement; shows the file's text on stderr. */
static int qtg_approver_check_text(const char *statement, const char *word, const char *path) {
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
  free(text);
  return 0;
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

static int qtg_approver_sign_stdin(const uint8_t secret[QTG_APPROVER_SECRET_LEN], const char *document,
                                   const char *plan) {
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
  if (qtg_request_statement_check(text, len) < 0) {
    fprintf(stderr, "qtgd approver: stdin is not one approval or initiation statement "
                    "(qtg-approval-v2 or qtg-initiation-v1, then deployment, request, class, digest "
                    "and plan lines)\n");
    return 1;
  }
  text[len] = '\0';
  if (document != NULL && (qtg_approver_check_text(text, "digest", document) != 0 ||
                           qtg_approver_check_text(text, "plan", plan) != 0))
    return 1;
  uint8_t sig[QTG_APPROVER_SIGNATURE_LEN];
  char hex[2 * QTG_APPROVER_SIGNATURE_LEN + 1];
  if (qtg_approver_sign(secret, text, len, sig) != 0) {
    fprintf(stderr, "qtgd approver: signing failed\n");
    return 1;
  }
  qtg_hex_encode(sig, sizeof sig, hex);
  fprintf(stderr, "signed:\n%.*s", (int)len, text);
  printf("%s\n", hex);
  return 0;
}

int qtg_approver_main(int argc, char **argv) {
  int sign = argc >= 1 && strcmp(argv[0], "sign") == 0;
  if (!(argc == 2 || (sign && argc == 4)) ||
      (strcmp(argv[0], "key") != 0 && strcmp(argv[0], "public") != 0 && !sign)) {
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
  int rc = !sign ? qtg_approver_print_public(secret)
                 : qtg_approver_sign_stdin(secret, argc == 4 ? argv[2] : NULL, argc == 4 ? argv[3] : NULL);
  OPENSSL_cleanse(secret, sizeof secret);
  return rc;
}
