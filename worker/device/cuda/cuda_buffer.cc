#include "worker/device/cuda/cuda_buffer.h"

#include <utility>

#include <cuda_runtime_api.h>

#include "absl/strings/str_cat.h"

#include "worker/device/cuda/cuda_status.h"

namespace flatshard::cuda {

absl::StatusOr<CudaBuffer> CudaBuffer::Allocate(Where where, size_t count, DType dtype,
                                                MemoryTracker* tracker, MemoryKind kind) {
  if (CudaDeviceCount() == 0) {
    return absl::FailedPreconditionError("no CUDA device on this machine");
  }
  CudaBuffer buffer;
  buffer.count_ = count;
  buffer.dtype_ = dtype;
  buffer.where_ = where;
  const size_t bytes = buffer.bytes();
  const cudaError_t error = where == Where::kDevice ? cudaMalloc(&buffer.data_, bytes)
                                                    : cudaMallocHost(&buffer.data_, bytes);
  if (error != cudaSuccess) {
    (void)cudaGetLastError();
    buffer.data_ = nullptr;
    return absl::ResourceExhaustedError(absl::StrCat(
        "cannot allocate ", bytes, " bytes of ", where == Where::kDevice ? "device" : "pinned host",
        " memory: ", cudaGetErrorString(error)));
  }
  const absl::Status cleared = CudaStatus(cudaMemset(buffer.data_, 0, bytes), "cudaMemset");
  if (!cleared.ok()) return cleared;
  buffer.tracker_ = tracker;
  buffer.kind_ = kind;
  if (tracker != nullptr) tracker->Add(kind, static_cast<int64_t>(bytes));
  return buffer;
}

CudaBuffer::~CudaBuffer() { Release(); }

CudaBuffer::CudaBuffer(CudaBuffer&& other) noexcept { *this = std::move(other); }

CudaBuffer& CudaBuffer::operator=(CudaBuffer&& other) noexcept {
  if (this != &other) {
    Release();
    data_ = std::exchange(other.data_, nullptr);
    count_ = std::exchange(other.count_, 0);
    dtype_ = other.dtype_;
    where_ = other.where_;
    tracker_ = std::exchange(other.tracker_, nullptr);
    kind_ = other.kind_;
  }
  return *this;
}

void CudaBuffer::Release() {
  if (data_ == nullptr) return;
  if (tracker_ != nullptr) tracker_->Sub(kind_, static_cast<int64_t>(bytes()));
  if (where_ == Where::kDevice) {
    cudaFree(data_);
  } else {
    cudaFreeHost(data_);
  }
  data_ = nullptr;
  count_ = 0;
}

}  // namespace flatshard::cuda
