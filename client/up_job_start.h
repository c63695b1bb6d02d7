// `flatshard up --job`: the job created on the cluster that just started
// (or the one its state dir brought back, continued), and the wait until it
// is READY, with `up` supervising its daemons meanwhile.
#ifndef FLATSHARD_CLIENT_UP_JOB_START_H_
#define FLATSHARD_CLIENT_UP_JOB_START_H_

#include <ostream>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

#include "client/flatshard_client.h"
#include "client/local_cluster.h"
#include "client/up_supervisor.h"
#include "flatshard/v1/job.pb.h"

namespace flatshard {

// What ended the wait.
struct UpJobStart {
  int signal = 0;  // a stop signal, or SIGCHLD: the coordinator is gone for good
  // READY (when signal is 0 and not workers_gone).
  absl::StatusOr<v1::Job> job = absl::UnknownError("");
  // Every worker exited and none is to be started again: it never will be.
  bool workers_gone = false;
};

// Creates `spec`'s job (ALREADY_EXISTS: continues the state dir's) and waits
// up to `timeout` for it to be READY, in 1 s slices so that signals are
// heard: a daemon's exit goes to `supervisor`, and a coordinator it starts
// again gets the creation or the wait again (a new coordinator that had not
// kept the job gets it created again); a stop signal ends the wait. Other
// failures end it: at once when they are about the job or the request, else
// once the coordinator has not exited within 10 s (a coordinator that is
// stopping ends the watch UNAVAILABLE before it exits).
// Every worker gone for good (UpSupervisor::EveryWorkerGone) ends it too:
// no READY can come.
UpJobStart StartUpJob(FlatshardClient& client, const v1::JobSpec& spec, LocalCluster& cluster,
                      UpSupervisor& supervisor, absl::Duration timeout, std::ostream& out);

}  // namespace flatshard

#endif  // FLATSHARD_CLIENT_UP_JOB_START_H_
