// The control-plane benches' servers: real processes, as the workers are,
// forked before the bench touches gRPC (a process must not fork once gRPC's
// threads exist). Each reports one line (its addresses) on a pipe, serves
// until its stdin pipe closes, and dies with the bench (PR_SET_PDEATHSIG).
#ifndef FLATSHARD_BENCH_FORKED_SERVERS_H_
#define FLATSHARD_BENCH_FORKED_SERVERS_H_

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

namespace flatshard::bench {

class ForkedServers {
 public:
  // What a server process runs: start serving, `report` its line, then
  // `serve_until_stopped` and shut down.
  using Serve = std::function<void(int index, const std::function<void(const std::string&)>& report,
                                   const std::function<void()>& serve_until_stopped)>;

  // Forks `n` server processes; exits the bench if one does not report.
  static ForkedServers Start(int n, const Serve& serve) {
    std::fflush(stdout);  // a child would print what is buffered again
    ForkedServers servers;
    for (int i = 0; i < n; ++i) {
      int out[2], in[2];
      if (::pipe(out) != 0 || ::pipe(in) != 0) std::exit(1);
      const pid_t pid = ::fork();
      if (pid == 0) {
        ::prctl(PR_SET_PDEATHSIG, SIGKILL);
        ::close(out[0]);
        ::close(in[1]);
        // The earlier servers' write ends: held here, they would keep those
        // servers up until this one stops.
        for (int fd : servers.keepalive_) ::close(fd);
        const auto report = [&](const std::string& line) {
          const std::string sent = line + "\n";
          if (::write(out[1], sent.data(), sent.size()) != static_cast<ssize_t>(sent.size())) {
            ::_exit(1);
          }
        };
        const auto serve_until_stopped = [&] {
          char byte = 0;
          while (::read(in[0], &byte, 1) > 0) {
          }
        };
        serve(i, report, serve_until_stopped);
        ::_exit(0);
      }
      ::close(out[1]);
      ::close(in[0]);
      std::string line;
      char c = 0;
      while (::read(out[0], &c, 1) == 1 && c != '\n') line.push_back(c);
      ::close(out[0]);
      if (line.empty()) {
        std::fprintf(stderr, "server process %d did not start\n", i);
        std::exit(1);
      }
      servers.pids_.push_back(pid);
      servers.keepalive_.push_back(in[1]);
      servers.lines_.push_back(line);
    }
    return servers;
  }

  // Each process's reported line, by index.
  const std::vector<std::string>& lines() const { return lines_; }

  // Stops every server and waits for its process.
  void Stop() {
    for (int fd : keepalive_) ::close(fd);
    for (pid_t pid : pids_) ::waitpid(pid, nullptr, 0);
    keepalive_.clear();
    pids_.clear();
  }

 private:
  std::vector<pid_t> pids_;
  std::vector<int> keepalive_;  // write ends; closing one stops its server
  std::vector<std::string> lines_;
};

}  // namespace flatshard::bench

#endif  // FLATSHARD_BENCH_FORKED_SERVERS_H_
