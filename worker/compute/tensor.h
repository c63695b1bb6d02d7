// The activation tensor the layer library passes between layers: a row-major
// float32 matrix. Token models flatten [batch, seq_len] into rows. This type
// owns plain host memory and never knows about devices or parameters.
#ifndef FLATSHARD_WORKER_COMPUTE_TENSOR_H_
#define FLATSHARD_WORKER_COMPUTE_TENSOR_H_

#include <cstddef>
#include <cstdint>
#include <vector>

namespace flatshard::compute {

struct Tensor {  // row-major [rows, cols] float32 activations
  int64_t rows = 0, cols = 0;
  std::vector<float> values;

  size_t size() const { return values.size(); }
  float* Row(int64_t r) { return values.data() + r * cols; }
  const float* Row(int64_t r) const { return values.data() + r * cols; }
};

// A zero-filled [rows, cols] tensor.
inline Tensor ZeroTensor(int64_t rows, int64_t cols) {
  Tensor t;
  t.rows = rows;
  t.cols = cols;
  t.values.assign(static_cast<size_t>(rows * cols), 0.0f);
  return t;
}

// Reshapes `t` to [rows, cols], zero-filled, reusing its allocation.
inline void ResizeZero(Tensor& t, int64_t rows, int64_t cols) {
  t.rows = rows;
  t.cols = cols;
  t.values.assign(static_cast<size_t>(rows * cols), 0.0f);
}

}  // namespace flatshard::compute

#endif  // FLATSHARD_WORKER_COMPUTE_TENSOR_H_
