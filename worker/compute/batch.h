// One rank's slice of a training batch, as a DataSource produces it (in host
// memory) and Model::ForwardLoss consumes it (copying it to the device). Plain
// data: no validation happens here.
#ifndef FLATSHARD_WORKER_COMPUTE_BATCH_H_
#define FLATSHARD_WORKER_COMPUTE_BATCH_H_

#include <cstdint>
#include <vector>

namespace flatshard::compute {

struct HostMatrix {  // row-major [rows, cols] float32 in host memory
  int64_t rows = 0, cols = 0;
  std::vector<float> values;

  size_t size() const { return values.size(); }
  float* Row(int64_t r) { return values.data() + r * cols; }
  const float* Row(int64_t r) const { return values.data() + r * cols; }
};

// A zero-filled [rows, cols] host matrix.
inline HostMatrix ZeroMatrix(int64_t rows, int64_t cols) {
  HostMatrix m;
  m.rows = rows;
  m.cols = cols;
  m.values.assign(static_cast<size_t>(rows * cols), 0.0f);
  return m;
}

struct Batch {
  int64_t batch_size = 0;       // samples in this (local) batch
  int64_t seq_len = 1;          // tokens per sample for token models, else 1
  HostMatrix inputs;            // dense inputs [batch, features] (regression / classification)
  std::vector<int32_t> ids;     // token ids [batch * seq_len] (token models)
  HostMatrix targets;           // MSE targets [rows, out]
  std::vector<int32_t> labels;  // cross-entropy labels, one per output row
};

}  // namespace flatshard::compute

#endif  // FLATSHARD_WORKER_COMPUTE_BATCH_H_
