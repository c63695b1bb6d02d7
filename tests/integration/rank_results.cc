#include "tests/integration/rank_results.h"

#include <fstream>

#include "absl/strings/str_cat.h"

namespace flatshard::testing {

void WriteRankResult(const std::string& dir, int rank, const LocalTrainResult& result) {
  std::ofstream losses(absl::StrCat(dir, "/losses-", rank), std::ios::binary);
  for (const LocalStepRecord& s : result.steps) {
    losses.write(reinterpret_cast<const char*>(&s.loss), sizeof(double));
  }
  std::ofstream memory(absl::StrCat(dir, "/memory-", rank));
  memory << result.peak_unsharded_bytes << " " << result.peak_live_units << "\n";
  if (rank != 0) return;
  std::ofstream params(dir + "/params", std::ios::binary);
  for (const auto& [fqn, values] : result.final_params) {
    params << fqn << "\n" << values.size() << "\n";
    params.write(reinterpret_cast<const char*>(values.data()),
                 static_cast<std::streamsize>(values.size() * sizeof(float)));
  }
}

std::vector<double> ReadRankLosses(const std::string& dir, int rank) {
  std::ifstream in(absl::StrCat(dir, "/losses-", rank), std::ios::binary);
  std::vector<double> losses;
  double x;
  while (in.read(reinterpret_cast<char*>(&x), sizeof(x))) losses.push_back(x);
  return losses;
}

std::map<std::string, std::vector<float>> ReadFinalParams(const std::string& dir) {
  std::map<std::string, std::vector<float>> out;
  std::ifstream in(dir + "/params", std::ios::binary);
  std::string fqn;
  size_t n = 0;
  while (std::getline(in, fqn) && in >> n) {
    in.get();
    std::vector<float> values(n);
    in.read(reinterpret_cast<char*>(values.data()),
            static_cast<std::streamsize>(n * sizeof(float)));
    out[fqn] = std::move(values);
  }
  return out;
}

}  // namespace flatshard::testing
