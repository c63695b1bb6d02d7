// Tests LinkFailures (coordinator/link_failures.h): whom a formation that
// failed on a connection between two ranks blames.
#include "coordinator/link_failures.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace flatshard {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;
using ::testing::UnorderedElementsAre;

TEST(LinkFailuresTest, AFirstFailedLinkBlamesNoOne) {
  LinkFailures links;
  EXPECT_THAT(links.Record("spare", "survivor-a"), IsEmpty());
}

TEST(LinkFailuresTest, AnEndOfASecondFailedLinkIsBlamed) {
  // A spare that can reach no one: a different survivor each try.
  LinkFailures links;
  EXPECT_THAT(links.Record("spare", "survivor-a"), IsEmpty());
  EXPECT_THAT(links.Record("survivor-b", "spare"), ElementsAre("spare"));
  // The same link failing again blames both its ends.
  LinkFailures again;
  EXPECT_THAT(again.Record("spare", "survivor-a"), IsEmpty());
  EXPECT_THAT(again.Record("spare", "survivor-a"), UnorderedElementsAre("spare", "survivor-a"));
}

TEST(LinkFailuresTest, FormingAnEpochStartsAWorkersCountOver) {
  LinkFailures links;
  EXPECT_THAT(links.Record("spare", "survivor-a"), IsEmpty());
  links.Formed({"spare", "survivor-a", "survivor-b"});
  EXPECT_THAT(links.Record("spare", "survivor-b"), IsEmpty());
  // Only the workers that formed start over.
  LinkFailures partly;
  EXPECT_THAT(partly.Record("spare", "survivor-a"), IsEmpty());
  partly.Formed({"survivor-a"});
  EXPECT_THAT(partly.Record("survivor-a", "spare"), ElementsAre("spare"));
}

TEST(LinkFailuresTest, ARankCannotFailALinkToItself) {
  LinkFailures links;
  EXPECT_THAT(links.Record("w", "w"), IsEmpty());
  EXPECT_THAT(links.Record("w", ""), ElementsAre("w"));  // the first counted "w" once, not twice
}

}  // namespace
}  // namespace flatshard
