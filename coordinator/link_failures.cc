#include "coordinator/link_failures.h"

namespace flatshard {

std::vector<std::string> LinkFailures::Record(const std::string& reporter,
                                              const std::string& peer) {
  std::vector<std::string> blamed;
  for (const std::string* end : {&reporter, &peer}) {
    if (end->empty() || (end == &peer && peer == reporter)) continue;  // counted once
    if (++failed_[*end] > kForgiven) blamed.push_back(*end);
  }
  return blamed;
}

}  // namespace flatshard
