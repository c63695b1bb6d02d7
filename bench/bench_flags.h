// What the benchmarks' flags share. They parse with CLI11, so --help works
// and a bad value is refused by name; these validators say the bound in
// their message (CLI::PositiveNumber's names DBL_MAX as its upper bound).
#ifndef FLATSHARD_BENCH_BENCH_FLAGS_H_
#define FLATSHARD_BENCH_BENCH_FLAGS_H_

#include <cstdio>
#include <exception>
#include <string>
#include <utility>

#include "CLI/CLI.hpp"
#include "absl/synchronization/mutex.h"
#include "rpc/mutex_deadlock_detection.h"

namespace flatshard::bench {

// A count: iterations, rounds, sizes, processes.
inline CLI::Range AtLeastOne() { return CLI::Range(1, 1 << 30); }
// An index, such as a GPU ordinal.
inline CLI::Range AtLeastZero() { return CLI::Range(0, 1 << 30); }

// A value one of the project's parsers (ParseDeviceKind, ParseDType, ...)
// accepts; anything else is refused with that parser's message, so the flag
// can be parsed again after CLI11_PARSE knowing it succeeds.
template <typename Parse>
CLI::Validator ParsedBy(Parse parse, std::string what) {
  return CLI::Validator(
      [parse](std::string& value) {
        auto parsed = parse(value);
        return parsed.ok() ? std::string() : std::string(parsed.status().message());
      },
      std::move(what));
}

// --abseil-deadlock-detection: runs absl::Mutex as Debian's Abseil does by
// default, its deadlock detector on (RunMain turns it off, as every flatshard
// program does; rpc/mutex_deadlock_detection.h), so that a bench can show
// what the detector costs. Call ApplyAbseilDeadlockDetection after parsing,
// before any thread starts or server process is forked.
inline void AddAbseilDeadlockDetectionFlag(CLI::App& app, bool& on) {
  app.add_flag("--abseil-deadlock-detection", on,
               "Keep Debian's Abseil default, absl::Mutex's deadlock detector on (in this "
               "process and the servers it forks), to measure what it costs");
}
inline void ApplyAbseilDeadlockDetection(bool on) {
  if (on) absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kAbort);
}

// A benchmark's main: `body` parses with CLI11_PARSE, which catches its own
// errors; anything else thrown (CLI11 set-up errors, std::bad_alloc) is a bug
// but still ends with a message and exit status 1, not std::terminate.
template <typename Body>
int RunMain(const char* name, Body&& body) noexcept {
  // Measured as the daemons run: without Abseil's deadlock detector.
  TurnOffMutexDeadlockDetection();
  try {
    return body();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: %s\n", name, e.what());
  } catch (...) {
    std::fprintf(stderr, "%s: an unknown exception\n", name);
  }
  return 1;
}

}  // namespace flatshard::bench

#endif  // FLATSHARD_BENCH_BENCH_FLAGS_H_
