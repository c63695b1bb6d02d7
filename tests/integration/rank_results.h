// How multi-process tests hand a rank's training results to the parent: each
// rank writes its per-step losses (and rank 0 the final parameters) into a
// shared directory; the parent reads them back.
#ifndef FLATSHARD_TESTS_INTEGRATION_RANK_RESULTS_H_
#define FLATSHARD_TESTS_INTEGRATION_RANK_RESULTS_H_

#include <map>
#include <string>
#include <vector>

#include "worker/runtime/local_trainer.h"

namespace flatshard::testing {

void WriteRankResult(const std::string& dir, int rank, const LocalTrainResult& result);
std::vector<double> ReadRankLosses(const std::string& dir, int rank);
std::map<std::string, std::vector<float>> ReadFinalParams(const std::string& dir);

}  // namespace flatshard::testing

#endif  // FLATSHARD_TESTS_INTEGRATION_RANK_RESULTS_H_
