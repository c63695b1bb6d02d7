// What every flatshard fuzz target shares. A target defines FuzzOneInput (and
// GeneratedSeeds); fuzz_driver.cc turns that into a program two ways:
//
// - With -DFLATSHARD_LIBFUZZER (clang, -fsanitize=fuzzer) it provides
//   LLVMFuzzerTestOneInput and libFuzzer supplies main: run it on the corpus,
//   e.g. `job_spec_fuzz -max_total_time=600 /tmp/new tests/fuzz/corpus/job_spec`.
// - Otherwise it provides a bounded driver, which is what CI runs through
//   ctest: it loads the target's corpus directory, requires every seed to be
//   accepted, then mutates the seeds for --seconds. It needs no compiler
//   support, so every build (and the ASan build) fuzzes a little on each run.
//
// Driver flags: --seconds S (default 5), --seed N, --corpus DIR (default: the
// directory CMake compiled in), --write-seeds DIR (write GeneratedSeeds and
// exit), and any other argument is a file to run once, as libFuzzer does, to
// reproduce a failure. A crash, an abort or an input running over its time
// limit writes the input to ./fuzz-failure-input before the process dies, so a
// CI failure can be replayed.
#ifndef FLATSHARD_TESTS_FUZZ_FUZZ_DRIVER_H_
#define FLATSHARD_TESTS_FUZZ_FUZZ_DRIVER_H_

#include <string>
#include <vector>

#include "absl/strings/string_view.h"

namespace flatshard::fuzz {

// A corpus file: its name in the corpus directory and its bytes. Files whose
// name starts with "regress-" are reproducers of fixed bugs: they must not
// crash, but need not be accepted. Every other seed must be accepted, so a
// parser that refuses everything cannot pass.
struct Seed {
  std::string name;
  std::string bytes;
};

// Defined by each target. Runs the code under test on `input` and aborts
// (FUZZ_CHECK) when what it accepted breaks an invariant; returns whether the
// input was accepted.
bool FuzzOneInput(absl::string_view input);

// Defined by each target: the seeds it derives with the code under test (a
// manifest ManifestToJson wrote, serialized requests, the JSON form of a YAML
// seed), given the corpus's current files. `--write-seeds DIR` writes them;
// the committed corpus is their output plus hand-written files.
std::vector<Seed> GeneratedSeeds(const std::vector<Seed>& corpus);

// Reports a broken invariant and aborts, so both libFuzzer and the driver
// record the input.
[[noreturn]] void FuzzFailure(const char* file, int line, const char* condition,
                              absl::string_view detail);

}  // namespace flatshard::fuzz

// The assertion a fuzz target makes about what the code under test accepted.
#define FUZZ_CHECK(condition, detail)                                           \
  do {                                                                          \
    if (!(condition)) {                                                         \
      ::flatshard::fuzz::FuzzFailure(__FILE__, __LINE__, #condition, (detail)); \
    }                                                                           \
  } while (false)

#endif  // FLATSHARD_TESTS_FUZZ_FUZZ_DRIVER_H_
