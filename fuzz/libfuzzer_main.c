/* libfuzzer_main.c -- libFuzzer's entry point for one target, chosen at
 * compile time (-DQTG_FUZZ_TARGET=qtg_fuzz_<name>, see cmake/fuzz.cmake).
 * A property violation (the target returns -1 after saying why) becomes an
 * abort, so libFuzzer saves the input as a crash. */
#include <signal.h>
#include <stdlib.h>

#include "qtg_fuzz.h"

#ifndef QTG_FUZZ_TARGET
#error "define QTG_FUZZ_TARGET"
#endif

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc;
  (void)argv;
  signal(SIGPIPE, SIG_IGN);
  return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (QTG_FUZZ_TARGET(data, size) != 0) abort();
  return 0;
}
