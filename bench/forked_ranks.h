// The multi-process benches' ranks: real processes, as the workers are, each
// forked from the bench and waited for.
#ifndef FLATSHARD_BENCH_FORKED_RANKS_H_
#define FLATSHARD_BENCH_FORKED_RANKS_H_

#include <cstdio>
#include <functional>
#include <vector>

#include <sys/wait.h>
#include <unistd.h>

namespace flatshard::bench {

// Runs body(rank) in `world` forked processes (the exit code is what it
// returns) and waits for every one; true when all exited 0. Flush stdout
// before: a child would print what is buffered again.
inline bool RunForkedRanks(int world, const std::function<int(int rank)>& body) {
  std::fflush(stdout);
  std::vector<pid_t> pids;
  bool ok = true;
  for (int rank = 0; rank < world; ++rank) {
    const pid_t pid = fork();
    if (pid == 0) _exit(body(rank));
    if (pid < 0) {
      ok = false;
      break;
    }
    pids.push_back(pid);
  }
  for (pid_t pid : pids) {
    int status = 0;
    waitpid(pid, &status, 0);
    ok = ok && WIFEXITED(status) && WEXITSTATUS(status) == 0;
  }
  return ok;
}

}  // namespace flatshard::bench

#endif  // FLATSHARD_BENCH_FORKED_RANKS_H_
