// Whom a formation that failed on a link between two ranks is blamed on.
//
// A rank that fails its Configure for a reason of its own (no data set, no
// device memory) is blamed for it: a recovery passes that spare over. One
// that could not connect to a peer (core/status_payloads.h, UnreachablePeer)
// is different: either end may be at fault, or neither. A port the kernel
// handed from a dead worker to a survivor's new listener, which something
// else dialled first, refuses the spare's connection once; blaming the spare
// for it cost the job its spare, and a shrink. So a failed link blames no
// one the first time; an end of a second failed link, before any epoch has
// formed again, is blamed (a spare that can reach no one is refused after
// two tries, not one). A peer that is dead is the recovery's probe's to
// find, not this.
#ifndef FLATSHARD_COORDINATOR_LINK_FAILURES_H_
#define FLATSHARD_COORDINATOR_LINK_FAILURES_H_

#include <map>
#include <string>
#include <vector>

namespace flatshard {

class LinkFailures {
 public:
  // The failed links a worker may be an end of before it is blamed.
  static constexpr int kForgiven = 1;

  // `reporter` (a worker id) could not connect to `peer` in a formation.
  // Returns the ends blamed for it: those an end of more than kForgiven
  // failed links since an epoch last formed, this one counted.
  std::vector<std::string> Record(const std::string& reporter, const std::string& peer);

  // An epoch formed: every count starts over. Not only its members': a
  // worker left out of it (a spare passed over, one refused until it
  // registers again) would otherwise carry an old failure into a later
  // recovery and be blamed for its first.
  void Formed() { failed_.clear(); }

 private:
  std::map<std::string, int> failed_;  // by worker id; absent: none
};

}  // namespace flatshard

#endif  // FLATSHARD_COORDINATOR_LINK_FAILURES_H_
