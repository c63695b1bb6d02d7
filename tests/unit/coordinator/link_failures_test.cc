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

TEST(LinkFailuresTest, AnEpochFormingStartsEveryCountOver) {
  LinkFailures links;
  EXPECT_THAT(links.Record("spare", "survivor-a"), IsEmpty());
  EXPECT_THAT(links.Record("spare-2", "survivor-b"), IsEmpty());
  // Formed without "spare" (passed over, or refused until it registers
  // again): its old failure does not follow it into a later recovery.
  links.Formed();
  EXPECT_THAT(links.Record("spare", "survivor-b"), IsEmpty());
  EXPECT_THAT(links.Record("survivor-c", "spare-2"), IsEmpty());
}

TEST(LinkFailuresTest, AnEndIsCountedOnceALinkAndAnEmptyEndNotAtAll) {
  LinkFailures links;
  // A worker named as both ends (FormLocked never records that; the guard
  // holds anyway) counts once, not twice: still forgiven.
  EXPECT_THAT(links.Record("w", "w"), IsEmpty());
  LinkFailures unnamed;
  EXPECT_THAT(unnamed.Record("w", ""), IsEmpty());
  EXPECT_THAT(unnamed.Record("", "w"), ElementsAre("w"));  // "" is no one's count
}

}  // namespace
}  // namespace flatshard
