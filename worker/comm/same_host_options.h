// How the ranks of one host take the same-host collectives
// (SameHostCommunicator): their own header, so that GlooOptions can carry
// them without the communicator that applies them.
#ifndef FLATSHARD_WORKER_COMM_SAME_HOST_OPTIONS_H_
#define FLATSHARD_WORKER_COMM_SAME_HOST_OPTIONS_H_

#include <cstddef>

namespace flatshard {

struct SameHostOptions {
  // Collectives whose whole buffer is smaller go to the inner communicator:
  // below it the address exchange and the barrier (2 ceil(log2 W) hops
  // against the ring's W-1 for an all-gather) cost more than the copies save.
  // Measured on 2 cores (bench/RESULTS.md, "Same-host collectives"): at W=2
  // even at 1 MiB, ahead from 2-4 MiB. Tests set 0 to send every collective
  // down the same-host path. The ranks of a group agree on the largest any
  // of them asked for (SameHostCommunicator::Wrap).
  size_t min_bytes = size_t{4} << 20;
  // False: this rank opts out, and with it the whole group (it still takes
  // part in Wrap's exchanges, so ranks whose options differ agree).
  bool enabled = true;
};

}  // namespace flatshard

#endif  // FLATSHARD_WORKER_COMM_SAME_HOST_OPTIONS_H_
