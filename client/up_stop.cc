#include "client/up_stop.h"

#include <algorithm>
#include <csignal>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

#include "client/cli_output.h"
#include "client/save_before_stop.h"
#include "client/up_signals.h"

namespace flatshard {

int StopCluster(LocalPrometheus* prometheus, LocalCluster& cluster, const SayLine& say) {
  say("stopping the cluster... (Ctrl-C again to kill the daemons now)");
  std::atomic<bool> stopped{false};
  std::thread impatient([&] {
    while (!stopped.load()) {
      // Polled: nothing wakes a sigtimedwait when Stop() returns.
      const int got = TakeStopSignal(absl::Milliseconds(100));
      if (got != 0) {
        say(absl::StrCat(strsignal(got), " again: killing the daemons"));
        if (prometheus != nullptr) prometheus->Kill();
        cluster.KillAll();
        return;
      }
    }
  });
  bool clean = prometheus == nullptr || prometheus->Stop();
  clean &= cluster.Stop();
  stopped.store(true);
  impatient.join();
  const bool killed = cluster.KilledAny() || (prometheus != nullptr && prometheus->killed());
  say(clean    ? "stopped cleanly"
      : killed ? "stopped (some daemons had to be killed)"
               : "stopped (not every daemon exited cleanly; the logs above say why)");
  return clean ? kExitOk : kExitFailed;
}

std::unique_ptr<StopSave> SaveBeforeStop(const CoordinatorTarget& target, absl::Duration timeout,
                                         const SayLine& say) {
  auto save = std::make_unique<StopSave>();
  StopSave* s = save.get();  // outlives the thread: joined before it is destroyed
  save->thread = std::thread([target, say, s] {
    FlatshardClient client(target);
    absl::StatusOr<std::vector<UnsavedJob>> jobs = FindUnsavedJobs(client);
    if (!jobs.ok()) {
      say(absl::StrCat("not saving before stopping: ", jobs.status().message()));
    } else if (jobs->empty()) {
      s->kept.store(true);
    } else {
      s->phase.store(StopSave::kSaving);
      say("(Ctrl-C again to stop without saving)");
      s->kept.store(SaveUnsavedJobs(client, *jobs, absl::Now(), say).ok());
    }
    s->phase.store(StopSave::kDone);
  });
  // What giving up costs, by how far the save got.
  const auto lost = [s] {
    return s->phase.load() == StopSave::kListing
               ? std::string("whether a restart would restore a job's state is not known")
               : std::string("what it had not saved is lost");
  };
  const absl::Time give_up = absl::Now() + timeout;
  while (s->phase.load() != StopSave::kDone) {
    if (absl::Now() >= give_up) {
      say(absl::StrCat("the save did not finish in ", absl::FormatDuration(timeout),
                       " (--stop-save-timeout); stopping without it: ", lost()));
      return save;
    }
    // Polled: nothing wakes a sigtimedwait when the other thread finishes.
    const int got = TakeStopSignal(std::min(absl::Milliseconds(100), give_up - absl::Now()));
    if (got != 0) {
      say(absl::StrCat(strsignal(got), " again: stopping without waiting for the save: ", lost()));
      return save;
    }
  }
  // A Ctrl-C pressed as the save finished meant "stop waiting": not "kill
  // the daemons", which StopCluster would take it for.
  (void)TakeStopSignal(absl::ZeroDuration());
  return save;
}

}  // namespace flatshard
