// Row/column kernels: bias and positional-table adds, column sums, the
// embedding gather and attention's head split/merge. Column sums add their rows
// in the blocks kernels::ColumnSumBlocks defines, the host's order, so they
// match the host bit for bit (and repeat from run to run); the positional
// table's sums (SumRowsModulo) run one thread per output over its rows in row
// order, as the host loops.
#include "worker/device/cuda/cuda_kernels.h"
#include "worker/device/cuda/launch_config.cuh"
#include "worker/device/kernels/element_ops.h"

namespace flatshard::cuda {
namespace {

__global__ void AddBiasKernel(float* y, size_t total, const float* bias, size_t cols) {
  for (size_t i = FirstIndex(); i < total; i += GridStride()) y[i] += bias[i % cols];
}

// partials[k, c] = the sum of block k's rows of column c (kernels::ColumnSumBlocks),
// from zero in row order; a row's term is x[r, c], or x[r, c] * y[r, c] when
// `y` is given. A thread per (block, column), columns fastest, so a warp reads
// consecutive elements of a row.
__global__ void ColumnBlockSumsKernel(const float* x, const float* y, size_t rows, size_t cols,
                                      float* partials) {
  const size_t total = kernels::ColumnSumBlocks(rows) * cols;
  for (size_t i = FirstIndex(); i < total; i += GridStride()) {
    const size_t first = (i / cols) * kernels::kColumnSumBlockRows, c = i % cols;
    const size_t end =
        first + kernels::kColumnSumBlockRows < rows ? first + kernels::kColumnSumBlockRows : rows;
    float sum = 0.0f;
    if (y == nullptr) {
      for (size_t r = first; r < end; ++r) sum += x[r * cols + c];
    } else {
      for (size_t r = first; r < end; ++r) {
        const float product = x[r * cols + c] * y[r * cols + c];
        sum += product;
      }
    }
    partials[i] = sum;
  }
}

// out[c] += partials[0, c], then partials[1, c], ...: the blocks in order.
__global__ void AddColumnPartialsKernel(const float* partials, size_t blocks, float* out,
                                        size_t cols) {
  for (size_t c = FirstIndex(); c < cols; c += GridStride()) {
    float sum = out[c];
    for (size_t k = 0; k < blocks; ++k) sum += partials[k * cols + c];
    out[c] = sum;
  }
}

__global__ void AddRowsModuloKernel(float* x, size_t total, const float* table, size_t period,
                                    size_t cols) {
  for (size_t i = FirstIndex(); i < total; i += GridStride()) {
    const size_t row = i / cols;
    x[i] += table[(row % period) * cols + i % cols];
  }
}

// out[t, c] = x[t, c] + x[t + period, c] + ..., from 0 as the host's fill.
__global__ void SumRowsModuloKernel(const float* x, size_t rows, size_t period, size_t cols,
                                    float* out) {
  const size_t outputs = period * cols;
  for (size_t i = FirstIndex(); i < outputs; i += GridStride()) {
    const size_t t = i / cols, c = i % cols;
    float sum = 0.0f;
    for (size_t r = t; r < rows; r += period) sum += x[r * cols + c];
    out[i] = sum;
  }
}

__global__ void EmbeddingForwardKernel(const int32_t* ids, size_t total, const float* table,
                                       size_t dim, float* out) {
  for (size_t i = FirstIndex(); i < total; i += GridStride()) {
    out[i] = table[static_cast<size_t>(ids[i / dim]) * dim + i % dim];
  }
}

// The row-major element behind element `i` of the [batch, heads, seq, head_dim]
// tensor.
__device__ size_t RowElement(const HeadLayout& l, size_t i) {
  const auto head_dim = static_cast<size_t>(l.head_dim), seq = static_cast<size_t>(l.seq);
  const auto heads = static_cast<size_t>(l.heads);
  const size_t d = i % head_dim;
  const size_t t = (i / head_dim) % seq;
  const size_t h = (i / (head_dim * seq)) % heads;
  const size_t b = i / (head_dim * seq * heads);
  return (b * seq + t) * static_cast<size_t>(l.row_stride) + static_cast<size_t>(l.col_offset) +
         h * head_dim + d;
}

__global__ void SplitHeadsKernel(const float* rows, HeadLayout layout, float* heads, size_t total) {
  for (size_t i = FirstIndex(); i < total; i += GridStride()) {
    heads[i] = rows[RowElement(layout, i)];
  }
}

__global__ void MergeHeadsKernel(const float* heads, HeadLayout layout, float* rows, size_t total) {
  for (size_t i = FirstIndex(); i < total; i += GridStride()) {
    rows[RowElement(layout, i)] = heads[i];
  }
}

}  // namespace

cudaError_t LaunchAddBias(float* y, size_t rows, const float* bias, size_t cols,
                          cudaStream_t stream) {
  const size_t total = rows * cols;
  if (total == 0) return cudaSuccess;
  ClearStaleError();
  AddBiasKernel<<<BlocksFor(total), kThreads, 0, stream>>>(y, total, bias, cols);
  return cudaGetLastError();
}

cudaError_t LaunchColumnSums(const float* x, const float* y, size_t rows, float* out, size_t cols,
                             float* partials, cudaStream_t stream) {
  if (rows == 0 || cols == 0) return cudaSuccess;
  ClearStaleError();
  const size_t blocks = kernels::ColumnSumBlocks(rows);
  ColumnBlockSumsKernel<<<BlocksFor(blocks * cols), kThreads, 0, stream>>>(x, y, rows, cols,
                                                                           partials);
  if (const cudaError_t error = cudaGetLastError(); error != cudaSuccess) return error;
  AddColumnPartialsKernel<<<BlocksFor(cols), kThreads, 0, stream>>>(partials, blocks, out, cols);
  return cudaGetLastError();
}

cudaError_t LaunchAddRowsModulo(float* x, size_t rows, const float* table, size_t period,
                                size_t cols, cudaStream_t stream) {
  const size_t total = rows * cols;
  if (total == 0) return cudaSuccess;
  ClearStaleError();
  AddRowsModuloKernel<<<BlocksFor(total), kThreads, 0, stream>>>(x, total, table, period, cols);
  return cudaGetLastError();
}

cudaError_t LaunchSumRowsModulo(const float* x, size_t rows, size_t period, size_t cols, float* out,
                                cudaStream_t stream) {
  const size_t outputs = period * cols;
  if (outputs == 0) return cudaSuccess;
  ClearStaleError();
  SumRowsModuloKernel<<<BlocksFor(outputs), kThreads, 0, stream>>>(x, rows, period, cols, out);
  return cudaGetLastError();
}

cudaError_t LaunchEmbeddingForward(const int32_t* ids, size_t count, const float* table, size_t dim,
                                   float* out, cudaStream_t stream) {
  const size_t total = count * dim;
  if (total == 0) return cudaSuccess;
  ClearStaleError();
  EmbeddingForwardKernel<<<BlocksFor(total), kThreads, 0, stream>>>(ids, total, table, dim, out);
  return cudaGetLastError();
}

cudaError_t LaunchSplitHeads(const float* rows, const HeadLayout& layout, float* heads,
                             cudaStream_t stream) {
  const auto total = static_cast<size_t>(layout.elements());
  if (total == 0) return cudaSuccess;
  ClearStaleError();
  SplitHeadsKernel<<<BlocksFor(total), kThreads, 0, stream>>>(rows, layout, heads, total);
  return cudaGetLastError();
}

cudaError_t LaunchMergeHeads(const float* heads, const HeadLayout& layout, float* rows,
                             cudaStream_t stream) {
  const auto total = static_cast<size_t>(layout.elements());
  if (total == 0) return cudaSuccess;
  ClearStaleError();
  MergeHeadsKernel<<<BlocksFor(total), kThreads, 0, stream>>>(heads, layout, rows, total);
  return cudaGetLastError();
}

}  // namespace flatshard::cuda
