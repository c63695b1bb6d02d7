// `flatshard up` as its tests run it: the real binary as a child process,
// its output read line by line, its daemons found among its children, and
// wrapped daemons (`up --bin-dir`) that fail or wait on purpose.
// Header-only: each test target defines FLATSHARD_BIN_DIR (the binaries)
// and FLATSHARD_SOURCE_DIR.
#ifndef FLATSHARD_TESTS_INTEGRATION_UP_PROCESS_H_
#define FLATSHARD_TESTS_INTEGRATION_UP_PROCESS_H_

#include <csignal>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"

#include "client/child_process.h"
#include "client/flatshard_client.h"

namespace flatshard::testing {

inline std::string ReadAll(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// The example MLP job at world size 2 (beside the model file it names).
inline std::string JobFile(const std::string& dir) {
  std::ofstream(dir + "/mlp.yaml")
      << ReadAll(std::string(FLATSHARD_SOURCE_DIR) + "/examples/mlp.yaml");
  const std::string example = ReadAll(std::string(FLATSHARD_SOURCE_DIR) + "/examples/mlp-job.yaml");
  EXPECT_THAT(example, ::testing::HasSubstr("world_size: 4\n"));
  std::string path = dir + "/job.yaml";
  std::ofstream(path) << absl::StrReplaceAll(example, {{"world_size: 4\n", "world_size: 2\n"}});
  return path;
}

// One `flatshard up` with `flags`; its stdout is read line by line (with
// its stderr too when `and_stderr`, through a shell, for what it says
// went wrong).
inline std::unique_ptr<ChildProcess> StartUp(const std::vector<std::string>& flags,
                                             bool and_stderr = false) {
  std::vector<std::string> argv = {std::string(FLATSHARD_BIN_DIR) + "/flatshard", "up"};
  if (and_stderr) argv.insert(argv.begin(), {"/bin/sh", "-c", "exec \"$0\" \"$@\" 2>&1"});
  argv.insert(argv.end(), flags.begin(), flags.end());
  auto up = ChildProcess::Spawn(argv);
  EXPECT_TRUE(up.ok()) << up.status();
  return up.ok() ? *std::move(up) : nullptr;
}

// Its output up to and including the first line holding `text` (all of it
// if it exits or 120 s pass first).
inline std::string ReadUntil(ChildProcess& up, const std::string& text) {
  std::string said;
  absl::StatusOr<std::string> line;
  while ((line = up.ReadLine(absl::Seconds(120))).ok()) {
    said += *line + "\n";
    if (line->find(text) != std::string::npos) break;
  }
  return said;
}

// Two workers and the job at world size 2, everything under `dir`.
inline std::vector<std::string> UpFlags(const std::string& dir, const std::string& address_file) {
  return {"--workers",          "2",          "--job", JobFile(dir),     "--checkpoint-dir",
          dir + "/checkpoints", "--data-dir", dir,     "--address-file", address_file};
}

// A client of the coordinator `up` wrote into `address_file`.
inline FlatshardClient ClientOf(const std::string& address_file) {
  return FlatshardClient(std::string(absl::StripTrailingAsciiWhitespace(ReadAll(address_file))));
}

// The pid of `up`'s child daemon whose command line (arguments joined by
// NULs) holds `needle`, or -1.
inline pid_t DaemonPid(const ChildProcess& up, const std::string& needle) {
  std::istringstream children(
      ReadAll(absl::StrCat("/proc/", up.pid(), "/task/", up.pid(), "/children")));
  for (pid_t child = 0; children >> child;) {
    if (ReadAll(absl::StrCat("/proc/", child, "/cmdline")).find(needle) != std::string::npos) {
      return child;
    }
  }
  return -1;
}

inline pid_t WorkerPid(const ChildProcess& up, const std::string& id) {
  return DaemonPid(up, std::string("\0--worker-id\0", 13) + id + std::string("\0", 1));
}

inline pid_t CoordinatorPid(const ChildProcess& up) {
  return DaemonPid(up, std::string("/flatshard-coordinator\0", 23));
}

// A worker daemon SIGSTOPped (every command to it waits), continued when
// the test ends however it ends: stopped, it would not act on the SIGTERM
// its parent's death sends it. Signalled through a pidfd, so that a pid
// reaped and reused meanwhile is not.
struct FrozenWorker {
  int pid_fd;
  explicit FrozenWorker(pid_t pid) : pid_fd(static_cast<int>(syscall(SYS_pidfd_open, pid, 0))) {
    syscall(SYS_pidfd_send_signal, pid_fd, SIGSTOP, nullptr, 0);
  }
  ~FrozenWorker() {
    syscall(SYS_pidfd_send_signal, pid_fd, SIGCONT, nullptr, 0);
    close(pid_fd);
  }
  FrozenWorker(const FrozenWorker&) = delete;
  FrozenWorker& operator=(const FrozenWorker&) = delete;
};

inline int ExitStatus(ChildProcess& process) {
  const std::optional<int> status = process.Wait(absl::Seconds(60));
  return status.has_value() && WIFEXITED(*status) ? WEXITSTATUS(*status) : -1;
}

// A directory of daemons for `up --bin-dir`: each a shell script whose
// body is `worker` (for flatshard-worker) or `coordinator`, with $DAEMON
// standing for the real one.
inline std::string WrappedDaemons(const std::string& dir, const std::string& worker,
                                  const std::string& coordinator) {
  std::string bin = dir + "/wrapped-bin";
  std::filesystem::create_directories(bin);
  for (const std::string daemon : {"flatshard-coordinator", "flatshard-worker"}) {
    const std::string path = absl::StrCat(bin, "/", daemon);
    std::ofstream(path) << "#!/bin/sh\n"
                        << absl::StrReplaceAll(
                               daemon == "flatshard-worker" ? worker : coordinator,
                               {{"$DAEMON", absl::StrCat(FLATSHARD_BIN_DIR, "/", daemon)}})
                        << "\n";
    chmod(path.c_str(), 0755);
  }
  return bin;
}

}  // namespace flatshard::testing

#endif  // FLATSHARD_TESTS_INTEGRATION_UP_PROCESS_H_
