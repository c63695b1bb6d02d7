// EmbeddingBackward without floating-point atomics: table_grad[id] must receive
// its rows in row order (worker/device/stream.h), which is what makes the
// result repeat run to run and equal the host's loop bit for bit. The ids are
// sorted with their row numbers (cub::DeviceRadixSort is stable, so equal ids
// keep ascending rows), cub::DeviceRunLengthEncode finds each id's run and
// cub::DeviceScan its start, and one thread per (run, column) adds the run's
// rows in order.
#include <algorithm>
#include <cstdint>

#include <cub/device/device_radix_sort.cuh>
#include <cub/device/device_run_length_encode.cuh>
#include <cub/device/device_scan.cuh>

#include "worker/device/cuda/cuda_kernels.h"
#include "worker/device/cuda/launch_config.cuh"

namespace flatshard::cuda {
namespace {

constexpr size_t kAlignment = 256;  // what CUB expects of its temporary storage

size_t AlignUp(size_t bytes) { return (bytes + kAlignment - 1) / kAlignment * kAlignment; }

// Byte offsets of the pieces of the scratch buffer.
struct ScratchLayout {
  size_t rows_in = 0;      // 0, 1, ..., count - 1
  size_t sorted_ids = 0;   // the ids, ascending
  size_t sorted_rows = 0;  // their rows, ascending within an id
  size_t unique_ids = 0;   // one per run
  size_t run_counts = 0;
  size_t run_offsets = 0;
  size_t num_runs = 0;
  size_t cub_temp = 0;
  size_t cub_bytes = 0;
  size_t total = 0;
};

cudaError_t Layout(size_t count, ScratchLayout* layout) {
  const int n = static_cast<int>(count);
  size_t sort_bytes = 0, encode_bytes = 0, scan_bytes = 0;
  cudaError_t error = cub::DeviceRadixSort::SortPairs(
      nullptr, sort_bytes, static_cast<const int32_t*>(nullptr), static_cast<int32_t*>(nullptr),
      static_cast<const int32_t*>(nullptr), static_cast<int32_t*>(nullptr), n);
  if (error != cudaSuccess) return error;
  error = cub::DeviceRunLengthEncode::Encode(
      nullptr, encode_bytes, static_cast<const int32_t*>(nullptr), static_cast<int32_t*>(nullptr),
      static_cast<int32_t*>(nullptr), static_cast<int32_t*>(nullptr), n);
  if (error != cudaSuccess) return error;
  error = cub::DeviceScan::ExclusiveSum(nullptr, scan_bytes, static_cast<const int32_t*>(nullptr),
                                        static_cast<int32_t*>(nullptr), n);
  if (error != cudaSuccess) return error;

  const size_t ints = AlignUp(count * sizeof(int32_t));
  size_t offset = 0;
  for (size_t* piece : {&layout->rows_in, &layout->sorted_ids, &layout->sorted_rows,
                        &layout->unique_ids, &layout->run_counts, &layout->run_offsets}) {
    *piece = offset;
    offset += ints;
  }
  layout->num_runs = offset;
  offset += AlignUp(sizeof(int32_t));
  layout->cub_temp = offset;
  layout->cub_bytes = AlignUp(std::max({sort_bytes, encode_bytes, scan_bytes, size_t{1}}));
  layout->total = offset + layout->cub_bytes;
  return cudaSuccess;
}

__global__ void RowNumbersKernel(int32_t* rows, size_t count) {
  for (size_t i = FirstIndex(); i < count; i += GridStride()) rows[i] = static_cast<int32_t>(i);
}

// Work item i = (run, column): table_grad[id, column] += the run's rows of dout,
// in row order. Items past the number of runs (known only on the device) idle.
__global__ void AccumulateRunsKernel(const int32_t* unique_ids, const int32_t* run_offsets,
                                     const int32_t* run_counts, const int32_t* num_runs,
                                     const int32_t* sorted_rows, const float* dout, size_t dim,
                                     float* table_grad, size_t items) {
  const auto runs = static_cast<size_t>(*num_runs);
  for (size_t i = FirstIndex(); i < items; i += GridStride()) {
    const size_t run = i / dim, column = i % dim;
    if (run >= runs) continue;
    float* target = table_grad + static_cast<size_t>(unique_ids[run]) * dim + column;
    const auto begin = static_cast<size_t>(run_offsets[run]);
    const size_t end = begin + static_cast<size_t>(run_counts[run]);
    float sum = *target;
    for (size_t k = begin; k < end; ++k) {
      sum += dout[static_cast<size_t>(sorted_rows[k]) * dim + column];
    }
    *target = sum;
  }
}

template <typename T>
T* At(void* scratch, size_t offset) {
  return reinterpret_cast<T*>(static_cast<char*>(scratch) + offset);
}

}  // namespace

cudaError_t EmbeddingBackwardScratchBytes(size_t count, size_t* bytes) {
  *bytes = 0;
  if (count == 0) return cudaSuccess;
  if (count > static_cast<size_t>(INT32_MAX)) return cudaErrorInvalidValue;
  ScratchLayout layout;
  const cudaError_t error = Layout(count, &layout);
  if (error == cudaSuccess) *bytes = layout.total;
  return error;
}

cudaError_t LaunchEmbeddingBackward(const int32_t* ids, size_t count, const float* dout, size_t dim,
                                    float* table_grad, void* scratch, size_t scratch_bytes,
                                    cudaStream_t stream) {
  if (count == 0 || dim == 0) return cudaSuccess;
  if (count > static_cast<size_t>(INT32_MAX)) return cudaErrorInvalidValue;
  ClearStaleError();
  ScratchLayout layout;
  cudaError_t error = Layout(count, &layout);
  if (error != cudaSuccess) return error;
  if (scratch_bytes < layout.total) return cudaErrorInvalidValue;

  const int n = static_cast<int>(count);
  auto* rows_in = At<int32_t>(scratch, layout.rows_in);
  auto* sorted_ids = At<int32_t>(scratch, layout.sorted_ids);
  auto* sorted_rows = At<int32_t>(scratch, layout.sorted_rows);
  auto* unique_ids = At<int32_t>(scratch, layout.unique_ids);
  auto* run_counts = At<int32_t>(scratch, layout.run_counts);
  auto* run_offsets = At<int32_t>(scratch, layout.run_offsets);
  auto* num_runs = At<int32_t>(scratch, layout.num_runs);
  void* cub_temp = At<char>(scratch, layout.cub_temp);

  RowNumbersKernel<<<BlocksFor(count), kThreads, 0, stream>>>(rows_in, count);
  if ((error = cudaGetLastError()) != cudaSuccess) return error;
  size_t cub_bytes = layout.cub_bytes;
  error =
      cub::DeviceRadixSort::SortPairs(cub_temp, cub_bytes, ids, sorted_ids, rows_in, sorted_rows, n,
                                      0, static_cast<int>(sizeof(int32_t) * 8), stream);
  if (error != cudaSuccess) return error;
  // Counts past the last run are never written by the encode; zero them so the
  // scan over all `count` entries reads defined memory.
  error = cudaMemsetAsync(run_counts, 0, count * sizeof(int32_t), stream);
  if (error != cudaSuccess) return error;
  cub_bytes = layout.cub_bytes;
  error = cub::DeviceRunLengthEncode::Encode(cub_temp, cub_bytes, sorted_ids, unique_ids,
                                             run_counts, num_runs, n, stream);
  if (error != cudaSuccess) return error;
  cub_bytes = layout.cub_bytes;
  error = cub::DeviceScan::ExclusiveSum(cub_temp, cub_bytes, run_counts, run_offsets, n, stream);
  if (error != cudaSuccess) return error;

  const size_t items = count * dim;
  AccumulateRunsKernel<<<BlocksFor(items), kThreads, 0, stream>>>(
      unique_ids, run_offsets, run_counts, num_runs, sorted_rows, dout, dim, table_grad, items);
  return cudaGetLastError();
}

}  // namespace flatshard::cuda
