/* qtg_approver.c -- `qtgd approver`: an approver's own Ed25519 key, on the
 * approver's machine (it needs no database and no daemon).
 *
 *   qtgd approver key FILE     make a key (FILE, mode 0600, new); print the
 *                              public key for the signer's enrolment
 *   qtgd approver public FILE  print FILE's public key again
 *   qtgd approver sign FILE    read one approval statement on stdin, show
 *                              it on stderr, print its signature (128 hex)
 *
 * The statement comes from the request (the API's and the console's
 * approval_statement); docs/approvals.md says how to check it before
 * signing.  A statement of any other shape is refused, so the key signs
 * approval statements only.
 */
#include "qtg_approver.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include <openssl/crypto.h>

#include "qtg_approvers.h"
#include "qtg_crypto.h"
#include "qtg_keys.h"

static const char qtg_approver_usage[] =
    "usage: qtgd approver key FILE | public FILE | sign FILE < statement\n";

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

static int qtg_approver_sign_stdin(const uint8_t secret[QTG_APPROVER_SECRET_LEN]) {
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
  if (qtg_approval_statement_check(text, len) != 0) {
    fprintf(stderr, "qtgd approver: stdin is not one approval statement "
                    "(qtg-approval-v1, then request, class, digest and plan lines)\n");
    return 1;
  }
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
  if (argc != 2 || (strcmp(argv[0], "key") != 0 && strcmp(argv[0], "public") != 0 &&
                    strcmp(argv[0], "sign") != 0)) {
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
  int rc = strcmp(argv[0], "public") == 0 ? qtg_approver_print_public(secret)
                                          : qtg_approver_sign_stdin(secret);
  OPENSSL_cleanse(secret, sizeof secret);
  return rc;
}
