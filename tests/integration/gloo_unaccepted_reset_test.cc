// An abort must not reset a Gloo connection that its peer has not yet taken
// from its listening socket.
//
// Debian's Gloo accepts a pair's connection on its transport thread and then
// asks the socket for the peer's address under GLOO_ENFORCE. A connection
// reset while it waited in the backlog has no peer any more (ENOTCONN): the
// throw, on Gloo's own thread, ends the process with std::terminate. So a
// rank whose transport thread is slow to accept (a loaded host) could be
// taken down by any peer that aborted in the rendezvous, since an abort
// closed pairs with a reset. Here the slow rank is a stopped process, which
// makes the window certain instead of rare.

#include <cstring>
#include <fstream>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

#include "tests/integration/multiprocess.h"
#include "worker/comm/abort_signal.h"
#include "worker/comm/file_store.h"
#include "worker/comm/gloo_communicator.h"
#include "worker/comm/gloo_mesh_context.h"

namespace flatshard {
namespace {

using testing::AllRanksSucceeded;
using testing::MakeTempDir;
using testing::RunRanks;

constexpr char kPrefix[] = "mesh";

// The ranks' store, as the test sees their rendezvous through it:
// - ranks 0 and 1 stop at a gate once they have read each other's address,
//   until "go", so the test can stop the listening one before the other
//   connects to it;
// - rank 2 (of three) never publishes its address: it waits for a "go-late"
//   that no one sets until its abort ends the wait, so the others'
//   rendezvous waits for it;
// - a rank about to wait for rank 2's address says so ("left-pair-R": it
//   is past its pair with the other of ranks 0 and 1).
class ObservedStore : public Store {
 public:
  ObservedStore(std::shared_ptr<Store> inner, int rank) : inner_(std::move(inner)), rank_(rank) {}

  absl::Status Set(const std::string& key, const std::string& value) override {
    if (key == absl::StrCat(kPrefix, "/2")) {
      if (absl::Status go = inner_->Wait({"go-late"}, absl::Seconds(100)); !go.ok()) return go;
    }
    return inner_->Set(key, value);
  }
  absl::StatusOr<std::string> Get(const std::string& key, absl::Duration timeout) override {
    if (absl::Status said = SayIfLate(key); !said.ok()) return said;
    absl::StatusOr<std::string> value = inner_->Get(key, timeout);
    if (value.ok() && rank_ < 2 && key == absl::StrCat(kPrefix, "/", 1 - rank_)) {
      if (absl::Status at = inner_->Set(absl::StrCat("at-gate-", rank_), "1"); !at.ok()) return at;
      if (absl::Status go = inner_->Wait({"go"}, timeout); !go.ok()) return go;
    }
    return value;
  }
  absl::Status Wait(const std::vector<std::string>& keys, absl::Duration timeout) override {
    for (const std::string& key : keys) {
      if (absl::Status said = SayIfLate(key); !said.ok()) return said;
    }
    return inner_->Wait(keys, timeout);
  }
  absl::StatusOr<int64_t> Add(const std::string& key, int64_t delta) override {
    return inner_->Add(key, delta);
  }
  void Abort(const std::string& reason) override { inner_->Abort(reason); }

 private:
  absl::Status SayIfLate(const std::string& key) {
    if (key != absl::StrCat(kPrefix, "/2")) return absl::OkStatus();
    return inner_->Set(absl::StrCat("left-pair-", rank_), "1");
  }

  std::shared_ptr<Store> inner_;
  int rank_;
};

// The port of the one address a rank of two publishes (Gloo's Address:
// the socket address, then a sequence number).
int PublishedPort(const std::string& value) {
  sockaddr_storage address{};
  if (value.size() < sizeof(address)) return -1;
  std::memcpy(&address, value.data(), sizeof(address));
  if (address.ss_family != AF_INET) return -1;
  return ntohs(reinterpret_cast<const sockaddr_in*>(&address)->sin_port);
}

// Whether a connection on local port `port` is established and holds bytes
// nobody has read: the stopped rank's kernel completed the peer's connection
// and took its first message, which only a peer done connecting sends.
bool UnreadConnectionOn(int port) {
  std::ifstream tcp("/proc/net/tcp");
  std::string line;
  std::getline(tcp, line);  // the header
  while (std::getline(tcp, line)) {
    std::istringstream fields(line);
    std::string slot, local, remote, state, queues;
    fields >> slot >> local >> remote >> state >> queues;
    const size_t port_at = local.find(':');
    const size_t rx_at = queues.find(':');
    uint32_t local_port = 0;
    uint32_t unread = 0;
    if (port_at == std::string::npos || rx_at == std::string::npos || state != "01") continue;
    if (!absl::SimpleHexAtoi(local.substr(port_at + 1), &local_port) ||
        !absl::SimpleHexAtoi(queues.substr(rx_at + 1), &unread)) {
      continue;
    }
    if (static_cast<int>(local_port) == port && unread > 0) return true;
  }
  return false;
}

// The parent's part. Ranks 0 and 1 meet at their gate; the one that
// listens for the other is stopped; the other connects to it and goes on,
// and is aborted once it is past connecting: in the handshake (world 2,
// seen as its first bytes waiting in the stopped rank's kernel) or waiting
// for the late rank's address (world 3, "left-pair-R"). Only once its
// Create has returned is the stopped rank continued: it accepts the
// connection then. Whatever fails lands in `problem`; every rank is always
// released.
struct Choreography {
  std::string dir;
  int world;
  std::string problem;
  std::thread thread;

  ~Choreography() {
    if (thread.joinable()) thread.join();
  }

  absl::Status Verdicts(Store& store, const std::string& verdict) {
    for (int rank = 0; rank < world; ++rank) {
      absl::StatusOr<std::string> set =
          store.Get(absl::StrCat("verdict-", rank), absl::ZeroDuration());
      if (set.ok()) continue;
      if (absl::Status s = store.Set(absl::StrCat("verdict-", rank), verdict); !s.ok()) return s;
    }
    return absl::OkStatus();
  }

  void Run() {
    auto store = FileStore::Open(dir);
    if (!store.ok()) {
      problem = store.status().ToString();
      return;
    }
    pid_t stopped = -1;
    const absl::Status status = [&]() -> absl::Status {
      std::vector<std::string> ready = {"at-gate-0", "at-gate-1"};
      for (int rank = 0; rank < world; ++rank) ready.push_back(absl::StrCat("pid-", rank));
      if (absl::Status s = (*store)->Wait(ready, absl::Seconds(30)); !s.ok()) return s;
      std::string published[2];
      pid_t pids[2];
      for (int rank = 0; rank < 2; ++rank) {
        absl::StatusOr<std::string> value =
            (*store)->Get(absl::StrCat(kPrefix, "/", rank), absl::Seconds(1));
        absl::StatusOr<std::string> pid =
            (*store)->Get(absl::StrCat("pid-", rank), absl::Seconds(1));
        if (!value.ok()) return value.status();
        if (!pid.ok()) return pid.status();
        // Rank r's address for rank 1 - r comes first in what it published.
        published[rank] = value->substr(0, value->size() / static_cast<size_t>(world - 1));
        if (!absl::SimpleAtoi(*pid, &pids[rank])) return absl::InternalError("bad pid");
      }
      const int listener = GlooPairListens({published[0].begin(), published[0].end()},
                                           {published[1].begin(), published[1].end()})
                               ? 0
                               : 1;
      const int connector = 1 - listener;
      for (const auto& [rank, role] : {std::pair{listener, "listener"}, {connector, "connector"}}) {
        if (absl::Status s = (*store)->Set(absl::StrCat("role-", rank), role); !s.ok()) return s;
      }
      const int port = PublishedPort(published[listener]);
      if (port <= 0) return absl::InternalError("rank's published address is not IPv4");
      std::cerr << "rank " << listener << " listens on port " << port << "; stopping it\n";
      if (kill(pids[listener], SIGSTOP) != 0) return absl::InternalError("SIGSTOP failed");
      stopped = pids[listener];
      // WNOWAIT: a rank that died instead is left for RunRanks to report.
      siginfo_t info{};
      if (waitid(P_PID, static_cast<id_t>(stopped), &info, WSTOPPED | WEXITED | WNOWAIT) != 0 ||
          info.si_code != CLD_STOPPED) {
        return absl::InternalError("the listening rank did not stop");
      }
      if (absl::Status s = (*store)->Set("go", "1"); !s.ok()) return s;
      if (world == 2) {
        // Bounded: the connecting rank's first handshake bytes reach the
        // stopped rank's kernel within milliseconds.
        const absl::Time deadline = absl::Now() + absl::Seconds(30);
        while (!UnreadConnectionOn(port)) {
          if (absl::Now() > deadline) {
            return absl::DeadlineExceededError("no connection with unread bytes on the port");
          }
          absl::SleepFor(absl::Milliseconds(2));
        }
      } else if (absl::Status s =
                     (*store)->Wait({absl::StrCat("left-pair-", connector)}, absl::Seconds(30));
                 !s.ok()) {
        return s;
      }
      if (absl::Status s = (*store)->Set(absl::StrCat("verdict-", connector), "abort"); !s.ok()) {
        return s;
      }
      if (absl::Status s = (*store)->Wait({"connector-done"}, absl::Seconds(30)); !s.ok()) return s;
      kill(stopped, SIGCONT);
      stopped = -1;
      if (world == 2) return Verdicts(**store, "none");
      // The continued rank took the connection and went on (or failed
      // without dying): then the rest may end.
      if (absl::Status s =
              (*store)->Wait({absl::StrCat("left-pair-", listener)}, absl::Seconds(30));
          !s.ok()) {
        return s;
      }
      return Verdicts(**store, "abort");
    }();
    if (!status.ok()) {
      problem = status.ToString();
      (void)Verdicts(**store, "abort");  // release every rank
    }
    if (stopped > 0) kill(stopped, SIGCONT);
  }
};

// Ranks 0 and 1 of `world`; rank 2, if any, publishes late.
int RankBody(const std::string& dir, int world, int rank) {
  auto file = FileStore::Open(dir);
  CHILD_OK(file.status());
  auto mesh_store = FileStore::Open(dir);  // the one an abort aborts
  CHILD_OK(mesh_store.status());
  CHILD_OK((*file)->Set(absl::StrCat("pid-", rank), absl::StrCat(getpid())));
  GlooOptions options;
  options.timeout = absl::Seconds(20);
  options.prefix = kPrefix;
  options.abort = std::make_shared<AbortSignal>();
  auto store_abort =
      options.abort->OnAbort([s = *mesh_store](const std::string& reason) { s->Abort(reason); });
  std::jthread aborter([&] {
    absl::StatusOr<std::string> verdict =
        (*file)->Get(absl::StrCat("verdict-", rank), absl::Seconds(100));
    if (verdict.ok() && *verdict == "abort") options.abort->Abort("the test aborts it");
  });
  auto comm = GlooCommunicator::Create(std::make_shared<ObservedStore>(*mesh_store, rank), rank,
                                       world, options);
  const absl::StatusCode code = comm.status().code();
  comm = absl::CancelledError("destroyed");  // its pairs closed before anyone is told
  std::cerr << "rank " << rank << ": " << absl::StatusCodeToString(code) << "\n";
  absl::StatusOr<std::string> role = (*file)->Get(absl::StrCat("role-", rank), absl::Seconds(1));
  const std::string mine = role.ok() ? *role : "late";
  if (mine == "connector") {
    CHILD_OK((*file)->Set("connector-done", "1"));
  } else if (mine == "listener") {
    CHILD_OK((*file)->Set(absl::StrCat("left-pair-", rank), "1"));
  }
  aborter.join();
  if (mine == "connector") {
    CHILD_CHECK(code == absl::StatusCode::kAborted);
  } else if (mine == "listener") {
    // It took a connection its peer had closed, and is alive to say so: it
    // found the peer gone, or (world 3) was aborted while it waited for the
    // late rank. The peer's handshake sent only its notices, never its byte
    // (a send waits for the receiver's notice), so it cannot have finished.
    CHILD_CHECK(code == absl::StatusCode::kUnavailable ||
                (world == 3 && code == absl::StatusCode::kAborted));
  } else {
    CHILD_CHECK(code == absl::StatusCode::kAborted || code == absl::StatusCode::kUnavailable);
  }
  return 0;
}

void RunChoreography(int world) {
  const std::string dir = MakeTempDir(absl::StrCat("gloo-unaccepted-reset-w", world));
  Choreography choreography{dir, world, "", {}};
  auto results = RunRanks(
      world, [&](int rank) { return RankBody(dir, world, rank); }, absl::Seconds(150),
      [&]() -> std::shared_ptr<void> {
        choreography.thread = std::thread([&] { choreography.Run(); });
        return nullptr;
      });
  if (choreography.thread.joinable()) choreography.thread.join();
  EXPECT_EQ(choreography.problem, "");
  EXPECT_TRUE(AllRanksSucceeded(results));
}

// The connecting rank is aborted in Create's handshake, its pair to the
// stopped rank sent on and waiting for an answer.
TEST(GlooUnacceptedResetTest, AnAbortInTheHandshakeLeavesAPeerThatHasNotAcceptedAlive) {
  RunChoreography(2);
}

// The connecting rank is aborted inside ConnectFullMesh, its pair to the
// stopped rank done connecting, while it waits for the late rank's address.
TEST(GlooUnacceptedResetTest, AnAbortInTheMeshLeavesAPeerThatHasNotAcceptedAlive) {
  RunChoreography(3);
}

}  // namespace
}  // namespace flatshard
