// The optimizer passes on host memory against the memory-bandwidth bound for
// the bytes they must touch (issue #14 §2: >= 0.7x), with memcpy measured in
// the same run as the ceiling. Per element, AdamW reads param, grad, exp_avg
// and exp_avg_sq and writes param, exp_avg and exp_avg_sq: 28 bytes; Adam
// with amsgrad adds max_exp_avg_sq (36); SGD with momentum 20; plain SGD 12.
// The bound is bytes / (memcpy's read+write rate). Each compiled copy of the
// pass (host_optimizer_kernels.h: portable, AVX2+FMA, and the one chosen at
// run time) is timed, interleaved with memcpy, one thread, median of --reps.
//
//   optimizer_bench [--elements 1048576,16777216] [--reps 15]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"

#include "bench/bench_flags.h"
#include "worker/device/host/host_optimizer_kernels.h"

namespace flatshard {
namespace {

using Clock = std::chrono::steady_clock;
using host_kernels::HostIsa;

template <typename Fn>
double Seconds(Fn&& fn) {
  const auto start = Clock::now();
  fn();
  return std::chrono::duration<double>(Clock::now() - start).count();
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

const char* IsaName(HostIsa isa) {
  switch (isa) {
    case HostIsa::kBest:
      return "best (chosen at run time)";
    case HostIsa::kPortable:
      return "portable";
    case HostIsa::kAvx2Fma:
      return "avx2+fma";
  }
  return "?";
}

struct Pass {
  const char* name;
  int bytes_per_element;
};

int Main(int argc, char** argv) {
  std::vector<size_t> sizes = {size_t{1} << 20, size_t{1} << 24};
  int reps = 15;
  CLI::App app{
      "optimizer_bench: each optimizer pass (AdamW, Adam amsgrad, SGD with and without "
      "momentum) in each instruction set, against memcpy's rate for the bytes it touches"};
  app.add_option("--elements", sizes, "Parameter counts")
      ->delimiter(',')
      ->check(flatshard::bench::AtLeastOne())
      ->capture_default_str();
  app.add_option("--reps", reps, "Repetitions (medians)")
      ->check(CLI::Range(3, 100000))
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  std::vector<HostIsa> isas = {HostIsa::kPortable};
  if (host_kernels::HostIsaSupported(HostIsa::kAvx2Fma)) {
    isas.push_back(HostIsa::kAvx2Fma);
  }
  isas.push_back(HostIsa::kBest);
  const Pass passes[] = {{"adamw", 28}, {"adam amsgrad", 36}, {"sgd momentum", 20}, {"sgd", 12}};

  std::printf("| elements | pass | copy | bytes | time | GB/s (r+w) | bound time | / bound |\n");
  std::printf("|---|---|---|---|---|---|---|---|\n");
  for (const size_t n : sizes) {
    std::vector<float> p(n, 0.5f), g(n, 0.01f), m(n, 0.0f), v(n, 0.0f), vmax(n, 0.0f);
    // memcpy of a 4-array-sized buffer: the ceiling's read+write rate.
    std::vector<char> src(n * 16, 1), dst(n * 16, 0);
    std::vector<double> all_copy_rates;
    for (const Pass& pass : passes) {
      for (const HostIsa isa : isas) {
        std::vector<double> copy_rate, times;
        for (int r = 0; r < reps; ++r) {
          const double copy = Seconds([&] { std::memcpy(dst.data(), src.data(), src.size()); });
          copy_rate.push_back(2.0 * static_cast<double>(src.size()) / copy);
          times.push_back(Seconds([&] {
            const std::string name = pass.name;
            if (name == "adamw" || name == "adam amsgrad") {
              AdamCoefficients c;
              c.amsgrad = name == "adam amsgrad";
              c.decoupled = !c.amsgrad;
              c.decay_factor = 0.99999f;
              c.lerp_weight = 0.1f;
              c.beta2 = 0.999f;
              c.one_minus_beta2 = 0.001f;
              c.bias_correction2_sqrt = 0.03f;
              c.eps = 1e-8f;
              c.neg_step_size = -1e-3f;
              host_kernels::AdamStep(c, p.data(), g.data(), m.data(), v.data(),
                                     c.amsgrad ? vmax.data() : nullptr, n, isa);
            } else {
              SgdCoefficients c;
              c.momentum = name == "sgd momentum";
              c.momentum_value = 0.9f;
              c.neg_lr = -1e-3f;
              host_kernels::SgdStep(c, p.data(), g.data(), c.momentum ? m.data() : nullptr, n, isa);
            }
          }));
        }
        const double t = Median(times);
        const double bytes = static_cast<double>(n) * pass.bytes_per_element;
        const double bound = bytes / Median(copy_rate);
        all_copy_rates.insert(all_copy_rates.end(), copy_rate.begin(), copy_rate.end());
        std::printf("| %zu | %s | %s | %.1f MB | %.2f ms | %.1f | %.2f ms | %.2f |\n", n, pass.name,
                    IsaName(isa), bytes / 1e6, t * 1e3, bytes / t / 1e9, bound * 1e3, bound / t);
        std::fflush(stdout);
      }
    }
    std::printf("\nmemcpy of %.0f MB beside the passes: %.1f GB/s read+write (median)\n\n",
                static_cast<double>(src.size()) / 1e6, Median(all_copy_rates) / 1e9);
  }
  return 0;
}

}  // namespace
}  // namespace flatshard

int main(int argc, char** argv) {
  return flatshard::bench::RunMain("optimizer_bench", [&] { return flatshard::Main(argc, argv); });
}
