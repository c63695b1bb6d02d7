#include "tests/integration/multiprocess.h"

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"

namespace flatshard::testing {

std::vector<RankResult> RunRanks(int world, const std::function<int(int rank)>& body,
                                 absl::Duration timeout,
                                 const std::function<std::shared_ptr<void>()>& after_fork) {
  std::cout.flush();
  std::cerr.flush();
  std::vector<pid_t> pids;
  for (int rank = 0; rank < world; ++rank) {
    const pid_t pid = fork();
    if (pid == 0) {
      // A child never outlives the test process, even if that one crashes.
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (getppid() == 1) _exit(3);
      // As flatshard-worker does: Gloo's write to a peer that aborted or
      // exited fails EPIPE instead of killing the rank.
      signal(SIGPIPE, SIG_IGN);
      int code = 1;
      try {
        code = body(rank);
      } catch (const std::exception& e) {
        std::cerr << "rank " << rank << ": uncaught exception: " << e.what() << "\n";
      }
      std::cout.flush();
      std::cerr.flush();
      _exit(code);
    }
    pids.push_back(pid);
  }
  const std::shared_ptr<void> parent_state = after_fork ? after_fork() : nullptr;
  std::vector<RankResult> results(static_cast<size_t>(world));
  const absl::Time deadline = absl::Now() + timeout;
  size_t remaining = pids.size();
  bool killed = false;
  while (remaining > 0) {
    int status = 0;
    // Blocks until a child exits or the watchdog period ends; WNOHANG keeps the
    // deadline check responsive without a fixed sleep.
    const pid_t pid = waitpid(-1, &status, killed ? 0 : WNOHANG);
    if (pid == 0) {
      if (absl::Now() > deadline) {
        for (size_t i = 0; i < pids.size(); ++i) {
          if (results[i].exit_code == -1 && results[i].signal == 0) {
            results[i].timed_out = true;
            kill(pids[i], SIGKILL);
          }
        }
        killed = true;
      } else {
        // Wait for any child state change for at most a short slice.
        sigset_t set;
        sigemptyset(&set);
        sigaddset(&set, SIGCHLD);
        timespec slice{0, 5 * 1000 * 1000};
        sigtimedwait(&set, nullptr, &slice);
      }
      continue;
    }
    if (pid < 0) break;
    for (size_t i = 0; i < pids.size(); ++i) {
      if (pids[i] != pid) continue;
      if (WIFEXITED(status)) results[i].exit_code = WEXITSTATUS(status);
      if (WIFSIGNALED(status)) results[i].signal = WTERMSIG(status);
      --remaining;
    }
  }
  return results;
}

::testing::AssertionResult AllRanksSucceeded(const std::vector<RankResult>& results) {
  std::string problems;
  for (size_t r = 0; r < results.size(); ++r) {
    const RankResult& result = results[r];
    if (result.exit_code == 0) continue;
    absl::StrAppend(&problems, " rank ", r, ":", result.timed_out ? " timed out (killed)" : "",
                    result.signal != 0 ? absl::StrCat(" signal ", result.signal) : "",
                    result.exit_code > 0 ? absl::StrCat(" exit ", result.exit_code) : "");
  }
  if (problems.empty()) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "ranks failed:" << problems;
}

namespace {

// Directories MakeTempDir made, removed when the test program exits having
// passed (kept, and named, when it failed: they hold the daemons' logs).
// Forked ranks leave by _exit and never run this; the pid check covers any
// child that would exit normally.
struct TempDirs {
  pid_t owner = getpid();
  std::vector<std::string> paths;
};

TempDirs& Registry() {
  static auto* dirs = new TempDirs();
  return *dirs;
}

void RemoveTempDirs() {
  TempDirs& dirs = Registry();
  if (getpid() != dirs.owner || dirs.paths.empty()) return;
  const ::testing::UnitTest* test = ::testing::UnitTest::GetInstance();
  if (test != nullptr && test->Failed()) {
    std::cerr << "kept for inspection: " << absl::StrJoin(dirs.paths, " ") << "\n";
    return;
  }
  for (const std::string& path : dirs.paths) {
    std::error_code ignored;
    std::filesystem::remove_all(path, ignored);
  }
}

}  // namespace

std::string MakeTempDir(const std::string& tag) {
  const char* base = std::getenv("TMPDIR");
  std::string pattern =
      absl::StrCat(base != nullptr ? base : "/tmp", "/flatshard-", tag, "-XXXXXX");
  std::vector<char> buffer(pattern.begin(), pattern.end());
  buffer.push_back('\0');
  if (mkdtemp(buffer.data()) == nullptr) {
    ADD_FAILURE() << "mkdtemp(" << pattern << "): " << std::strerror(errno);
    return "/tmp";
  }
  static const bool registered = std::atexit(RemoveTempDirs) == 0;
  (void)registered;
  Registry().paths.emplace_back(buffer.data());
  return std::string(buffer.data());
}

}  // namespace flatshard::testing
