/* test_settings.c -- MG_* parsing: defaults, typed values, and each kind of
 * invalid value refused with the variable's name and the accepted form. */
#include <stdlib.h>
#include <string.h>

#include "qtg_log.h"
#include "qtg_runtime.h"
#include "qtg_settings.h"
#include "qtg_test.h"

typedef struct {
  const char *const *kv; /* NULL-terminated name, value pairs */
} fake_env;

static const char *fake_lookup(const char *name, void *ud) {
  const fake_env *e = ud;
  for (int i = 0; e->kv[i]; i += 2)
    if (strcmp(e->kv[i], name) == 0) return e->kv[i + 1];
  return NULL;
}

static int load(qtg_settings *s, const char *const *kv, char *err, size_t n) {
  fake_env e = {kv};
  return qtg_settings_load(s, fake_lookup, &e, err, n);
}

static void test_defaults(qtg_test_counts *c) {
  qtg_settings s;
  char err[256];
  const char *kv[] = {NULL};
  CHECK(c, load(&s, kv, err, sizeof err) == 0);
  CHECK(c, qtg_settings_bool(&s, QTG_S_WORKERS_ENABLED) == 1);
  CHECK(c, qtg_settings_num(&s, QTG_S_NODE_DISPATCH_INTERVAL_SECONDS) == 2);
  CHECK(c, qtg_settings_num(&s, QTG_S_NODE_OBSERVE_INTERVAL_SECONDS) == 5);
  CHECK(c, qtg_settings_num(&s, QTG_S_NODE_RECOVERY_INTERVAL_SECONDS) == 60);
  CHECK(c, qtg_settings_num(&s, QTG_S_NODE_RECOVERY_BATCH_SIZE) == 10);
  CHECK(c, qtg_settings_num(&s, QTG_S_CALLBACK_DISPATCH_INTERVAL_SECONDS) == 3);
  CHECK(c, qtg_settings_num(&s, QTG_S_CALLBACK_MAX_ATTEMPTS) == 5);
  CHECK(c, qtg_settings_num(&s, QTG_S_EXPIRATION_CHECK_INTERVAL_SECONDS) == 30);
  CHECK(c, qtg_settings_num(&s, QTG_S_APPROVAL_TTL_SECONDS) == 300);
  CHECK(c, qtg_settings_num(&s, QTG_S_EXECUTOR_HEALTH_INTERVAL_SECONDS) == 60);
  CHECK(c, qtg_settings_num(&s, QTG_S_AUDIT_OUTBOX_PROMOTER_INTERVAL_SECONDS) == 1);
  CHECK(c, qtg_settings_num(&s, QTG_S_VERIFY_DRIFT_INTERVAL_SECONDS) == 21600);
  CHECK(c, qtg_settings_bool(&s, QTG_S_OBSERVE_TIMEOUT_ENFORCEMENT_ENABLED) == 0);
  CHECK(c, qtg_settings_bool(&s, QTG_S_EVM_NONCE_REAPER_ENABLED) == 1);
  CHECK(c, qtg_settings_bool(&s, QTG_S_CCIP_STRANDED_REAPER_ENABLED) == 1);
  CHECK(c, qtg_settings_bool(&s, QTG_S_BALANCE_HISTORY_ENABLED) == 1);
  CHECK(c, qtg_settings_bool(&s, QTG_S_BALANCE_SNAPSHOT_ENABLED) == 0);
  CHECK_STR(c, qtg_settings_str(&s, QTG_S_CEX_TRANSFER_INGEST_VENUES_CSV), "");
  CHECK(c, s.v[QTG_S_WORKERS_ENABLED].set == 0);
  qtg_settings_free(&s);
}

static void test_values(qtg_test_counts *c) {
  qtg_settings s;
  char err[256];
  const char *kv[] = {"MG_WORKERS_ENABLED", "off", "MG_NODE_DISPATCH_INTERVAL_SECONDS", " 0.5 ",
                      "MG_CALLBACK_MAX_ATTEMPTS", "7", "MG_NETWORK_CLASS", "mainnet",
                      "MG_CALLBACK_KEY", "s3cret", NULL};
  CHECK(c, load(&s, kv, err, sizeof err) == 0);
  CHECK(c, qtg_settings_bool(&s, QTG_S_WORKERS_ENABLED) == 0);
  CHECK(c, qtg_settings_num(&s, QTG_S_NODE_DISPATCH_INTERVAL_SECONDS) == 0.5);
  CHECK(c, qtg_settings_num(&s, QTG_S_CALLBACK_MAX_ATTEMPTS) == 7);
  CHECK_STR(c, qtg_settings_str(&s, QTG_S_NETWORK_CLASS), "mainnet");
  CHECK(c, s.v[QTG_S_CALLBACK_MAX_ATTEMPTS].set == 1);
  qtg_settings_free(&s);
}

static void expect_refused(qtg_test_counts *c, const char *name, const char *value, const char *hint) {
  qtg_settings s;
  char err[256] = "";
  const char *kv[] = {name, value, NULL};
  CHECK(c, load(&s, kv, err, sizeof err) == -1);
  CHECK(c, strstr(err, name) != NULL);
  CHECK(c, strstr(err, hint) != NULL);
  if (!strstr(err, hint)) fprintf(stderr, "  message was: %s\n", err);
}

static void test_refusals(qtg_test_counts *c) {
  expect_refused(c, "MG_WORKERS_ENABLED", "maybe", "true or false");
  expect_refused(c, "MG_NODE_DISPATCH_INTERVAL_SECONDS", "2s", "a number");
  expect_refused(c, "MG_NODE_DISPATCH_INTERVAL_SECONDS", "", "a number");
  expect_refused(c, "MG_NODE_DISPATCH_INTERVAL_SECONDS", "-1", "between");
  expect_refused(c, "MG_NODE_DISPATCH_INTERVAL_SECONDS", "nan", "a number");
  expect_refused(c, "MG_CALLBACK_MAX_ATTEMPTS", "1.5", "an integer");
  expect_refused(c, "MG_CALLBACK_MAX_ATTEMPTS", "0", "between 1 and 100");
  expect_refused(c, "MG_DB_POOL_SIZE", "1e9", "between 1 and 256");
  expect_refused(c, "MG_LOG_LEVEL", "verbose", "debug, info, warn or error");
  expect_refused(c, "MG_NETWORK_CLASS", "Main Net", "a-z");
  expect_refused(c, "MG_NETWORK_CLASS", "", "1-32");
}

static void test_runloop_delay(qtg_test_counts *c) {
  CHECK(c, qtg_runloop_delay(0, 2, 0.5, 0) == 2);
  CHECK(c, qtg_runloop_delay(0, 2, 0.5, 1) == 2.5);
  CHECK(c, qtg_runloop_delay(0, 2, 0.5, -1) == 1.5);
  CHECK(c, qtg_runloop_delay(0, 0.01, 0, 0) == 0.1);
  CHECK(c, qtg_runloop_delay(4, 2, 0, 0) == 2);
  CHECK(c, qtg_runloop_delay(5, 2, 0, 0) == 32);
  CHECK(c, qtg_runloop_delay(6, 2, 0, 0) == 60);
  CHECK(c, qtg_runloop_delay(100, 2, 0, 0) == 60);
}

static void test_json_quote(qtg_test_counts *c) {
  char buf[64];
  const char in[] = "a\"b\\c\nd\x01";
  size_t n = qtg_json_quote(buf, sizeof buf, in, sizeof in - 1);
  buf[n] = '\0';
  CHECK_STR(c, buf, "\"a\\\"b\\\\c\\nd\\u0001\"");
  /* too small a buffer reports the size it needs and never overflows */
  char tiny[4];
  CHECK(c, qtg_json_quote(tiny, sizeof tiny, in, sizeof in - 1) == n);
  /* valid UTF-8 is kept; latin-1, 0xff, a character cut at the end, an
   * overlong form and a surrogate each become U+FFFD, byte by byte */
  const char bad[] = "caf\xc3\xa9 \xe2\x80\xa2 caf\xe9 \xff \xc0\xaf \xed\xa0\x80 \xe2\x80";
  n = qtg_json_quote(buf, sizeof buf, bad, sizeof bad - 1);
  CHECK(c, n < sizeof buf);
  buf[n < sizeof buf ? n : sizeof buf - 1] = '\0';
  CHECK_STR(c, buf, "\"caf\xc3\xa9 \xe2\x80\xa2 caf\xef\xbf\xbd \xef\xbf\xbd \xef\xbf\xbd\xef\xbf\xbd "
                    "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd \xef\xbf\xbd\xef\xbf\xbd\"");
  CHECK(c, qtg_json_quote(tiny, sizeof tiny, bad, sizeof bad - 1) == n);
}

int main(void) {
  qtg_test_counts c = {0, 0};
  test_defaults(&c);
  test_values(&c);
  test_refusals(&c);
  test_runloop_delay(&c);
  test_json_quote(&c);
  return qtg_test_finish(&c);
}
