/* fuzz_approver.c -- the `approver` target: the two texts `qtgd approver
 * sign KEY DOCUMENT PLAN` reads from the approver's files and describes by
 * the signer's rules (qtg_approver_payments, src/prelude/approver.lua).
 *
 * Input: the document, a NUL, the plan (without a NUL, the input is both).
 * Properties: no crash, leak or undefined behaviour; a description begins
 * with its heading and ends with a node, "nothing" or the caps line; a
 * refusal has a reason. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "qtg_approver_payments.h"
#include "qtg_fuzz.h"

static const char fuzz_approver_heading[] = "what qtg's signer may sign under this statement";

int qtg_fuzz_approver(const uint8_t *data, size_t size) {
  const uint8_t *nul = memchr(data, 0, size);
  const char *document = (const char *)data, *plan = document;
  size_t document_len = size, plan_len = size;
  if (nul != NULL) {
    document_len = (size_t)(nul - data);
    plan = (const char *)nul + 1;
    plan_len = size - document_len - 1;
  }
  char err[256] = "";
  char *text = qtg_approver_payments(document, document_len, plan, plan_len, err, sizeof err);
  if (text == NULL) {
    if (err[0] == '\0') {
      fprintf(stderr, "approver: texts refused without a reason\n");
      return -1;
    }
    return 0;
  }
  int ok = strncmp(text, fuzz_approver_heading, sizeof fuzz_approver_heading - 1) == 0 && strchr(text, '\n');
  if (!ok) fprintf(stderr, "approver: a description without its heading or a line under it: %s\n", text);
  free(text);
  return ok ? 0 : -1;
}
