// Each layer's forward + backward against the sgemm rate for its GEMM shapes
// (issue #14 §2 "Compute"), on one rank's share of the PyTorch comparison's
// batches: the byte-level GPT (examples/gpt-small.yaml, 8 x 64 tokens) and
// the 35M MLP (bench/models/mlp35m.yaml, 16 samples), i.e. W = 2.
//
// The model runs through the worker's layer library on the CPU device, with
// module hooks that synchronize the stream and time every module's forward
// and backward. The ceiling of a Linear [rows, in] -> [rows, out] is the three
// sgemm calls its forward and backward need (y = x W^T, dx = dy W,
// dW = dy^T x), timed by calling OpenBLAS directly on the same shapes in the
// same run, interleaved with the model (A B A B ..., medians). Everything
// that is not a GEMM (bias, GELU, LayerNorm, softmax, head split, loss) is
// reported per module type beside it: it is the work the GEMM rate does not
// cover.
//
//   layer_bench [--reps 20] [--model gpt|mlp35m|all]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"

#include "bench/bench_flags.h"
#include "core/model_spec.h"
#include "core/model_spec_yaml.h"
#include "storage/spec_files.h"
#include "worker/compute/batch.h"
#include "worker/compute/dense_param_store.h"
#include "worker/compute/model.h"
#include "worker/compute/module_hooks.h"
#include "worker/device/host/cblas_api.h"
#include "worker/device/host/host_device.h"

namespace flatshard {
namespace {

using Clock = std::chrono::steady_clock;

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

// Times each module's forward and backward (the stream synchronized at every
// hook, so the time is the work, not its enqueueing).
class TimingHooks : public compute::ModuleHooks {
 public:
  TimingHooks(Stream& stream, size_t modules)
      : stream_(stream), forward_(modules), backward_(modules), start_(modules) {}
  absl::Status BeforeForward(int m) override { return Start(m); }
  absl::Status AfterForward(int m) override { return Stop(m, forward_); }
  absl::Status BeforeBackward(int m) override { return Start(m); }
  absl::Status AfterBackward(int m) override { return Stop(m, backward_); }
  double Seconds(int m) const {  // forward + backward of the last pass
    return forward_[static_cast<size_t>(m)] + backward_[static_cast<size_t>(m)];
  }

 private:
  absl::Status Start(int m) {
    absl::Status synced = stream_.Synchronize();
    start_[static_cast<size_t>(m)] = Clock::now();
    return synced;
  }
  absl::Status Stop(int m, std::vector<double>& into) {
    absl::Status synced = stream_.Synchronize();
    into[static_cast<size_t>(m)] =
        std::chrono::duration<double>(Clock::now() - start_[static_cast<size_t>(m)]).count();
    return synced;
  }
  Stream& stream_;
  std::vector<double> forward_, backward_;
  std::vector<Clock::time_point> start_;
};

struct LinearShape {
  int64_t rows, in, out;
  bool operator<(const LinearShape& o) const {
    return std::tie(rows, in, out) < std::tie(o.rows, o.in, o.out);
  }
};

// The three GEMMs of a Linear's forward and backward, row-major as the layer
// library calls them, on buffers allocated once.
class SgemmCeiling {
 public:
  explicit SgemmCeiling(LinearShape s)
      : s_(s),
        x_(static_cast<size_t>(s.rows * s.in), 0.5f),
        w_(static_cast<size_t>(s.out * s.in), 0.25f),
        y_(static_cast<size_t>(s.rows * s.out), 0.0f),
        dx_(x_.size(), 0.0f),
        dw_(w_.size(), 0.0f) {}
  double Run() {
    const auto m = static_cast<blasint>(s_.rows), k = static_cast<blasint>(s_.in),
               n = static_cast<blasint>(s_.out);
    const auto start = Clock::now();
    // y [rows, out] = x [rows, in] W^T
    Cblas().sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, n, k, 1.0f, x_.data(), k, w_.data(),
                  k, 0.0f, y_.data(), n);
    // dx [rows, in] = dy [rows, out] W [out, in]
    Cblas().sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, k, n, 1.0f, y_.data(), n, w_.data(),
                  k, 0.0f, dx_.data(), k);
    // dW [out, in] += dy^T [out, rows] x [rows, in]
    Cblas().sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, n, k, m, 1.0f, y_.data(), n, x_.data(),
                  k, 1.0f, dw_.data(), k);
    return std::chrono::duration<double>(Clock::now() - start).count();
  }

 private:
  LinearShape s_;
  std::vector<float> x_, w_, y_, dx_, dw_;
};

int RunModel(const std::string& name, const std::string& file, int64_t batch, int64_t seq,
             int reps) {
  absl::StatusOr<ModelSpec> spec = LoadModelSpecFile(file);
  if (!spec.ok()) {
    std::fprintf(stderr, "%s\n", std::string(spec.status().message()).c_str());
    return 1;
  }
  absl::StatusOr<ModelIndex> index = IndexModel(*spec);
  if (!index.ok()) return 1;
  auto device = std::make_shared<HostDevice>();
  std::unique_ptr<Stream> stream = *device->CreateStream(StreamRole::kCompute, "compute");
  MemoryTracker memory;
  const bool tokens = name == "gpt";
  auto model = compute::Model::Create(
      *spec, *index, tokens ? compute::LossKind::kCrossEntropy : compute::LossKind::kMse,
      {device.get(), stream.get(), &memory});
  if (!model.ok()) {
    std::fprintf(stderr, "%s\n", std::string(model.status().message()).c_str());
    return 1;
  }
  compute::DenseParamStore store(*index);
  if (!store.Init(*index, 1).ok()) return 1;
  compute::Batch b;
  b.batch_size = batch;
  if (tokens) {
    b.seq_len = seq;
    for (int64_t i = 0; i < batch * seq; ++i) {
      b.ids.push_back(static_cast<int32_t>((i * 7919) % (*model)->vocab_size()));
      b.labels.push_back(static_cast<int32_t>((i * 104729 + 1) % (*model)->vocab_size()));
    }
  } else {
    b.inputs = compute::ZeroMatrix(batch, (*model)->input_features());
    b.targets = compute::ZeroMatrix(batch, (*model)->output_features());
    for (size_t i = 0; i < b.inputs.values.size(); ++i) {
      b.inputs.values[i] = static_cast<float>((i * 37) % 101) / 50.0f - 1.0f;
    }
  }
  const int64_t rows = batch * (tokens ? seq : 1);
  // Each Linear module and its shape, from its weight [out, in].
  std::map<int, LinearShape> linears;
  for (size_t m = 0; m < index->modules.size(); ++m) {
    const IndexedModule& mod = index->modules[m];
    if (mod.type != "Linear" || mod.params.empty()) continue;
    const std::vector<int64_t>& w = index->params[static_cast<size_t>(mod.params[0])].spec->shape;
    linears[static_cast<int>(m)] = {rows, w[1], w[0]};
  }
  std::map<LinearShape, SgemmCeiling> ceilings;
  for (const auto& [m, shape] : linears) ceilings.try_emplace(shape, shape);

  TimingHooks hooks(*stream, index->modules.size());
  // Per repetition: the model's pass with per-module times, then each
  // distinct Linear shape's three sgemm calls.
  std::map<int, std::vector<double>> module_s;
  std::map<LinearShape, std::vector<double>> sgemm_s;
  std::vector<double> pass_s, pass_plain_s;
  compute::NoopModuleHooks plain;
  for (int r = 0; r < reps + 2; ++r) {
    auto start = Clock::now();
    if (!(*model)->ForwardLoss(b, store, plain).ok() || !(*model)->Backward(store, plain).ok() ||
        !stream->Synchronize().ok()) {
      return 1;
    }
    const double plain_s = std::chrono::duration<double>(Clock::now() - start).count();
    start = Clock::now();
    if (!(*model)->ForwardLoss(b, store, hooks).ok() || !(*model)->Backward(store, hooks).ok()) {
      return 1;
    }
    const double timed_s = std::chrono::duration<double>(Clock::now() - start).count();
    std::map<LinearShape, double> this_rep;
    for (auto& [shape, ceiling] : ceilings) this_rep[shape] = ceiling.Run();
    if (r < 2) continue;  // warm-up
    pass_plain_s.push_back(plain_s);
    pass_s.push_back(timed_s);
    for (size_t m = 0; m < index->modules.size(); ++m) {
      module_s[static_cast<int>(m)].push_back(hooks.Seconds(static_cast<int>(m)));
    }
    for (const auto& [shape, s] : this_rep) sgemm_s[shape].push_back(s);
  }

  std::printf(
      "\n%s: %ld rows per rank, forward + backward %.2f ms (%.2f ms with a sync at every "
      "module hook)\n\n",
      name.c_str(), static_cast<long>(rows), Median(pass_plain_s) * 1e3, Median(pass_s) * 1e3);
  std::printf(
      "| Linear [rows, in] -> [rows, out] | modules | layer fwd+bwd | 3 sgemm | GFLOP/s layer | "
      "GFLOP/s sgemm | layer / sgemm rate |\n|---|---|---|---|---|---|---|\n");
  double gemm_total = 0, linear_total = 0;
  for (const auto& [shape, ceiling] : ceilings) {
    std::vector<double> layer;
    int count = 0;
    for (const auto& [m, s] : linears) {
      if (s.rows == shape.rows && s.in == shape.in && s.out == shape.out) {
        layer.push_back(Median(module_s[m]));
        ++count;
      }
    }
    const double layer_s = Median(layer), gemm_s = Median(sgemm_s[shape]);
    const double flops = 6.0 * static_cast<double>(shape.rows * shape.in * shape.out);
    gemm_total += gemm_s * count;
    linear_total += layer_s * count;
    std::printf("| [%ld, %ld] -> [%ld, %ld] | %d | %.3f ms | %.3f ms | %.1f | %.1f | %.2f |\n",
                static_cast<long>(shape.rows), static_cast<long>(shape.in),
                static_cast<long>(shape.rows), static_cast<long>(shape.out), count, layer_s * 1e3,
                gemm_s * 1e3, flops / layer_s / 1e9, flops / gemm_s / 1e9, gemm_s / layer_s);
  }
  // Leaf modules that are not Linear, by type: the work around the GEMMs.
  std::map<std::string, double> by_type;
  std::map<std::string, int> type_count;
  for (size_t m = 0; m < index->modules.size(); ++m) {
    const IndexedModule& mod = index->modules[m];
    const double s = Median(module_s[static_cast<int>(m)]);
    double children = 0;
    for (int c : mod.children) children += Median(module_s[c]);
    const double own = std::max(0.0, s - children);  // a container's own work
    if (mod.type == "Linear" || (own < 1e-6 && !mod.children.empty())) continue;
    by_type[mod.type] += own;
    ++type_count[mod.type];
  }
  std::printf(
      "\n| module type (own work, children excluded) | modules | fwd+bwd per pass |\n"
      "|---|---|---|\n");
  for (const auto& [type, s] : by_type) {
    std::printf("| %s | %d | %.3f ms |\n", type.c_str(), type_count[type], s * 1e3);
  }
  std::printf(
      "\nLinears: %.2f ms against %.2f ms of bare sgemm (%.2f of the rate); the pass: %.2f "
      "ms, of which the GEMMs' ceiling is %.0f %%\n",
      linear_total * 1e3, gemm_total * 1e3, gemm_total / linear_total, Median(pass_s) * 1e3,
      100.0 * gemm_total / Median(pass_s));
  return 0;
}

}  // namespace
}  // namespace flatshard

static int Main(int argc, char** argv) {
  int reps = 20;
  std::string which = "all";
  CLI::App app{
      "layer_bench: each layer's forward + backward against the sgemm rate of its GEMM shapes, "
      "one rank's batch at W=2 of the PyTorch comparison. Run with OPENBLAS_NUM_THREADS=1, as "
      "the workers' comparison does."};
  app.add_option("--reps", reps, "Timed passes (after 2 warm-up passes), medians")
      ->check(flatshard::bench::AtLeastOne())
      ->capture_default_str();
  app.add_option("--model", which, "gpt | mlp35m | all")
      ->check(CLI::IsMember({"gpt", "mlp35m", "all"}))
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  const std::string root = FLATSHARD_SOURCE_DIR;
  int rc = 0;
  if (which != "mlp35m") {
    rc |= flatshard::RunModel("gpt", root + "/examples/gpt-small.yaml", 8, 64, reps);
  }
  if (which != "gpt") {
    rc |= flatshard::RunModel("mlp35m", root + "/bench/models/mlp35m.yaml", 16, 1, reps);
  }
  return rc;
}

int main(int argc, char** argv) {
  return flatshard::bench::RunMain("layer_bench", [&] { return Main(argc, argv); });
}
