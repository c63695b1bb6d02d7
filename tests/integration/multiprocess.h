// Runs a test body in W real processes (fork), one per rank, and collects their
// exit codes; a watchdog kills every child when the deadline passes so a hung
// collective fails the test instead of hanging it. Fork happens before the test
// starts any thread, so each child is a clean single-threaded process.
#ifndef FLATSHARD_TESTS_INTEGRATION_MULTIPROCESS_H_
#define FLATSHARD_TESTS_INTEGRATION_MULTIPROCESS_H_

#include <functional>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "absl/status/status.h"
#include "absl/time/time.h"

// For test bodies running in a child process: report the failed condition or
// status on stderr (the parent shows it) and end the body with exit code 1.
#define CHILD_CHECK(cond)                                                        \
  do {                                                                           \
    if (!(cond)) {                                                               \
      std::cerr << __FILE__ << ":" << __LINE__ << ": check failed: " #cond "\n"; \
      return 1;                                                                  \
    }                                                                            \
  } while (false)

#define CHILD_OK(expr)                                                           \
  do {                                                                           \
    const ::absl::Status& child_status_ = (expr);                                \
    if (!child_status_.ok()) {                                                   \
      std::cerr << __FILE__ << ":" << __LINE__ << ": " << child_status_ << "\n"; \
      return 1;                                                                  \
    }                                                                            \
  } while (false)

namespace flatshard::testing {

struct RankResult {
  int exit_code = -1;  // -1 when killed by a signal
  int signal = 0;      // the signal that ended it, 0 if none
  bool timed_out = false;
};

// Calls body(rank) in `world` child processes; the child's exit code is the
// body's return value. Returns one result per rank. `after_fork`, if given, runs
// in the parent once every child exists (so servers it starts are never forked);
// what it returns is kept alive until the children have exited.
std::vector<RankResult> RunRanks(
    int world, const std::function<int(int rank)>& body, absl::Duration timeout,
    const std::function<std::shared_ptr<void>()>& after_fork = nullptr);

// True when every rank exited 0; otherwise a description for the assertion.
::testing::AssertionResult AllRanksSucceeded(const std::vector<RankResult>& results);

// A fresh empty directory under $TMPDIR, removed when the test program exits
// having passed and kept (its path printed) when a test failed.
std::string MakeTempDir(const std::string& tag);

}  // namespace flatshard::testing

#endif  // FLATSHARD_TESTS_INTEGRATION_MULTIPROCESS_H_
