#include "metrics/build_info.h"

#include "absl/strings/str_cat.h"
#include "prometheus/gauge.h"

namespace flatshard {

std::string BuildVersion() {
  return absl::StrCat(FLATSHARD_VERSION, " (", FLATSHARD_GIT_REVISION, ")");
}

void AddBuildInfo(prometheus::Registry& registry, const std::string& component) {
#if defined(__clang__)
  const std::string compiler = absl::StrCat("clang ", __clang_major__, ".", __clang_minor__);
#else
  const std::string compiler = absl::StrCat("gcc ", __GNUC__, ".", __GNUC_MINOR__);
#endif
  prometheus::BuildGauge()
      .Name("flatshard_build_info")
      .Help("Always 1; the labels say which flatshard build this daemon runs")
      .Register(registry)
      .Add({{"component", component},
            {"version", FLATSHARD_VERSION},
            {"revision", FLATSHARD_GIT_REVISION},
            {"compiler", compiler},
            {"cuda", FLATSHARD_CUDA_BUILD ? "true" : "false"}})
      .Set(1);
}

}  // namespace flatshard
