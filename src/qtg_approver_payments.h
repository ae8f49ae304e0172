/* qtg_approver_payments.h -- what an approval lets qtg's signer sign, read
 * from the statement's two texts by the signer's rules, for `qtgd approver
 * sign KEY DOCUMENT PLAN` to show before it signs. */
#ifndef QTG_APPROVER_PAYMENTS_H
#define QTG_APPROVER_PAYMENTS_H

#include <stddef.h>

/* The description (lines, malloc'd: the caller frees and shows it
 * escaped), or NULL with why in err (a text is no JSON object, or Lua
 * could not run). */
char *qtg_approver_payments(const char *document, size_t document_len, const char *plan, size_t plan_len,
                            char *err, size_t errlen);

#endif
