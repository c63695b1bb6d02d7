#include "worker/device/cuda/cuda_device.h"

#include <cstdint>
#include <cstdlib>
#include <utility>

#include "absl/strings/str_cat.h"

#include "core/status_macros.h"
#include "worker/device/cuda/cublas_api.h"
#include "worker/device/cuda/cuda_status.h"
#include "worker/device/cuda/cuda_stream.h"

namespace flatshard::cuda {
namespace {

// Freed pinned blocks kept per size; more of one size are returned to CUDA.
constexpr size_t kPinnedCachedPerSize = 8;

// CudaStatus for a failed call, with the thread's last-error slot cleared so a
// later launch check does not report this failure again.
absl::Status Checked(cudaError_t error, const std::string& what) {
  if (error == cudaSuccess) return absl::OkStatus();
  (void)cudaGetLastError();
  return CudaStatus(error, what.c_str());
}

std::string VisibleDevicesSetting() {
  const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
  return visible == nullptr ? "CUDA_VISIBLE_DEVICES is unset"
                            : absl::StrCat("CUDA_VISIBLE_DEVICES='", visible, "'");
}

}  // namespace

ScopedDevice::ScopedDevice(int ordinal) {
  int current = -1;
  status_ = Checked(cudaGetDevice(&current), "cudaGetDevice");
  if (status_.ok() && current != ordinal) {
    status_ = Checked(cudaSetDevice(ordinal), absl::StrCat("cudaSetDevice(", ordinal, ")"));
    if (status_.ok()) previous_ = current;
  }
}

ScopedDevice::~ScopedDevice() {
  if (previous_ >= 0) (void)Checked(cudaSetDevice(previous_), "cudaSetDevice");
}

absl::StatusOr<std::unique_ptr<CudaDevice>> CudaDevice::Create(int ordinal) {
  int count = 0;
  const cudaError_t counted = cudaGetDeviceCount(&count);
  if (counted != cudaSuccess || count == 0) {
    (void)cudaGetLastError();
    return absl::FailedPreconditionError(absl::StrCat(
        "cuda device: no CUDA device is visible (",
        counted == cudaSuccess ? "cudaGetDeviceCount found none"
                               : absl::StrCat("cudaGetDeviceCount: ", cudaGetErrorName(counted),
                                              ": ", cudaGetErrorString(counted)),
        "; ", VisibleDevicesSetting(), ")"));
  }
  if (ordinal < 0 || ordinal >= count) {
    return absl::InvalidArgumentError(
        absl::StrCat("cuda device: ordinal ", ordinal, " is out of range: ", count,
                     " CUDA device(s) are visible (", VisibleDevicesSetting(), ")"));
  }
  // cuBLAS is opened here, not linked (worker/device/cuda/cublas_api.h).
  RETURN_IF_ERROR(LoadCublas().status());
  cudaDeviceProp properties{};
  RETURN_IF_ERROR(Checked(cudaGetDeviceProperties(&properties, ordinal),
                          absl::StrCat("cudaGetDeviceProperties(", ordinal, ")")));
  int pools_supported = 0;
  RETURN_IF_ERROR(
      Checked(cudaDeviceGetAttribute(&pools_supported, cudaDevAttrMemoryPoolsSupported, ordinal),
              "cudaDeviceGetAttribute(cudaDevAttrMemoryPoolsSupported)"));
  if (pools_supported == 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("cuda device ", ordinal, " (", properties.name,
                     ") does not support stream-ordered memory pools (cudaMallocAsync)"));
  }
  ScopedDevice current(ordinal);
  RETURN_IF_ERROR(current.status());
  cudaMemPool_t pool = nullptr;
  RETURN_IF_ERROR(
      Checked(cudaDeviceGetDefaultMemPool(&pool, ordinal), "cudaDeviceGetDefaultMemPool"));
  // Keep freed memory cached in the pool (see the header).
  uint64_t threshold = UINT64_MAX;
  RETURN_IF_ERROR(
      Checked(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &threshold),
              "cudaMemPoolSetAttribute(cudaMemPoolAttrReleaseThreshold)"));
  return std::unique_ptr<CudaDevice>(new CudaDevice(ordinal, properties.name, pool));
}

CudaDevice::~CudaDevice() {
  ScopedDevice current(ordinal_);
  for (auto& [bytes, blocks] : pinned_free_) {
    for (std::byte* block : blocks) (void)Checked(cudaFreeHost(block), "cudaFreeHost");
  }
}

absl::Status CudaDevice::MakeCurrent() {
  return Checked(cudaSetDevice(ordinal_), absl::StrCat("cudaSetDevice(", ordinal_, ")"));
}

absl::StatusOr<std::unique_ptr<Stream>> CudaDevice::CreateStream(StreamRole role,
                                                                 absl::string_view name) {
  ScopedDevice current(ordinal_);
  RETURN_IF_ERROR(current.status());
  int least = 0, greatest = 0;
  RETURN_IF_ERROR(Checked(cudaDeviceGetStreamPriorityRange(&least, &greatest),
                          "cudaDeviceGetStreamPriorityRange"));
  const int priority = role == StreamRole::kCommunication ? greatest : least;
  ASSIGN_OR_RETURN(std::unique_ptr<CudaStream> stream,
                   CudaStream::Create(this, priority, std::string(name)));
  return std::unique_ptr<Stream>(std::move(stream));
}

DeviceMemoryStats CudaDevice::MemoryStats() const {
  DeviceMemoryStats stats;
  uint64_t used = 0, reserved = 0;
  if (Checked(cudaMemPoolGetAttribute(pool_, cudaMemPoolAttrUsedMemCurrent, &used), "").ok()) {
    stats.pool_in_use_bytes = static_cast<int64_t>(used);
  }
  if (Checked(cudaMemPoolGetAttribute(pool_, cudaMemPoolAttrReservedMemCurrent, &reserved), "")
          .ok()) {
    stats.pool_reserved_bytes = static_cast<int64_t>(reserved);
  }
  ScopedDevice current(ordinal_);
  size_t free_bytes = 0, total_bytes = 0;
  if (current.status().ok() && Checked(cudaMemGetInfo(&free_bytes, &total_bytes), "").ok()) {
    stats.device_free_bytes = static_cast<int64_t>(free_bytes);
    stats.device_total_bytes = static_cast<int64_t>(total_bytes);
  }
  return stats;
}

absl::StatusOr<void*> CudaDevice::AllocateRaw(size_t bytes, Stream& stream) {
  if (bytes == 0) return nullptr;  // nothing to allocate; FreeRaw ignores null
  auto* cuda_stream = dynamic_cast<CudaStream*>(&stream);
  if (cuda_stream == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("cuda device: stream '", stream.name(), "' is not a CUDA stream"));
  }
  void* address = nullptr;
  const cudaError_t error = cudaMallocFromPoolAsync(&address, bytes, pool_, cuda_stream->raw());
  if (error == cudaErrorMemoryAllocation) {
    (void)cudaGetLastError();
    const DeviceMemoryStats stats = MemoryStats();
    return absl::ResourceExhaustedError(
        absl::StrCat("cuda device ", ordinal_, " (", name_, "): out of memory allocating ", bytes,
                     " bytes on stream '", stream.name(), "' (pool: ", stats.pool_in_use_bytes,
                     " bytes in use, ", stats.pool_reserved_bytes, " reserved; device: ",
                     stats.device_free_bytes, " of ", stats.device_total_bytes, " bytes free)"));
  }
  RETURN_IF_ERROR(Checked(error, absl::StrCat("cudaMallocFromPoolAsync(", bytes, " bytes)")));
  return address;
}

void CudaDevice::FreeRaw(void* address, size_t bytes, Stream& stream) {
  if (address == nullptr) return;
  if (auto* cuda_stream = dynamic_cast<CudaStream*>(&stream);
      cuda_stream != nullptr && &stream.device() == this) {
    // A failure here has nowhere else to go: the stream reports it.
    cuda_stream->Fail(Checked(cudaFreeAsync(address, cuda_stream->raw()),
                              absl::StrCat("cudaFreeAsync(", bytes, " bytes)")));
    return;
  }
  // Released on a stream that is not ours: we cannot order the free after its
  // work, so wait for the whole device, then free (cudaFree accepts pool memory).
  ScopedDevice current(ordinal_);
  (void)Checked(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  (void)Checked(cudaFree(address), "cudaFree");
}

absl::StatusOr<std::byte*> CudaDevice::AllocatePinnedRaw(size_t bytes) {
  if (bytes == 0) return nullptr;
  {
    std::lock_guard<std::mutex> lock(pinned_mu_);
    auto cached = pinned_free_.find(bytes);
    if (cached != pinned_free_.end() && !cached->second.empty()) {
      std::byte* block = cached->second.back();
      cached->second.pop_back();
      return block;
    }
  }
  ScopedDevice current(ordinal_);
  RETURN_IF_ERROR(current.status());
  void* block = nullptr;
  const cudaError_t error = cudaMallocHost(&block, bytes);
  if (error == cudaErrorMemoryAllocation) {
    (void)cudaGetLastError();
    return absl::ResourceExhaustedError(
        absl::StrCat("cuda device ", ordinal_, ": cannot pin ", bytes, " bytes of host memory"));
  }
  RETURN_IF_ERROR(Checked(error, absl::StrCat("cudaMallocHost(", bytes, " bytes)")));
  return static_cast<std::byte*>(block);
}

void CudaDevice::FreePinnedRaw(std::byte* data, size_t bytes) {
  if (data == nullptr) return;
  {
    std::lock_guard<std::mutex> lock(pinned_mu_);
    std::vector<std::byte*>& cached = pinned_free_[bytes];
    if (cached.size() < kPinnedCachedPerSize) {
      cached.push_back(data);
      return;
    }
  }
  ScopedDevice current(ordinal_);
  (void)Checked(cudaFreeHost(data), "cudaFreeHost");
}

}  // namespace flatshard::cuda
