// Tests rpc/host_port.h: addresses a worker advertises, IPv6 included.
#include "rpc/host_port.h"

#include <gtest/gtest.h>

namespace flatshard {
namespace {

TEST(HostPortTest, NamesAndIpv4AddressesJoinWithAColon) {
  EXPECT_EQ(JoinHostPort("127.0.0.1", 7000), "127.0.0.1:7000");
  EXPECT_EQ(JoinHostPort("node-3.example", 50051), "node-3.example:50051");
}

TEST(HostPortTest, Ipv6AddressesGoInBracketsOnce) {
  EXPECT_EQ(JoinHostPort("::1", 7000), "[::1]:7000");
  EXPECT_EQ(JoinHostPort("[::1]", 7000), "[::1]:7000");
  EXPECT_EQ(JoinHostPort("fe80::1%eth0", 1), "[fe80::1%eth0]:1");
}

TEST(HostPortTest, ABareHostHasNoBrackets) {
  EXPECT_EQ(BareHost("[::1]"), "::1");
  EXPECT_EQ(BareHost("::1"), "::1");
  EXPECT_EQ(BareHost("127.0.0.1"), "127.0.0.1");
  EXPECT_EQ(BareHost("["), "[");
}

}  // namespace
}  // namespace flatshard
