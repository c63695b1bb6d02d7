// One rank's slice of a training batch, as a DataSource produces it and
// Model::ForwardLoss consumes it. Plain data: no validation happens here.
#ifndef FLATSHARD_WORKER_COMPUTE_BATCH_H_
#define FLATSHARD_WORKER_COMPUTE_BATCH_H_

#include <cstdint>
#include <vector>

#include "worker/compute/tensor.h"

namespace flatshard::compute {

struct Batch {
  int64_t batch_size = 0;       // samples in this (local) batch
  int64_t seq_len = 1;          // tokens per sample for token models, else 1
  Tensor inputs;                // dense inputs [batch, features] (regression / classification)
  std::vector<int32_t> ids;     // token ids [batch * seq_len] (token models)
  Tensor targets;               // MSE targets [rows, out]
  std::vector<int32_t> labels;  // cross-entropy labels, one per output row
};

}  // namespace flatshard::compute

#endif  // FLATSHARD_WORKER_COMPUTE_BATCH_H_
