// How --ps names the shards of a job.
#include "worker/ps_group.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace dp {
namespace {

using List = std::vector<std::string>;

TEST(ExpandPsAddressesTest, AListIsTheShardsInItsOrder) {
  EXPECT_EQ(ExpandPsAddresses("a:1,b:2, c:3"), (List{"a:1", "b:2", "c:3"}));
}

TEST(ExpandPsAddressesTest, ANameWithOneAddressPerFamilyIsOneDpPs) {
  // localhost is 127.0.0.1 and often ::1 too: still one dp-ps.
  EXPECT_EQ(ExpandPsAddresses("localhost:5000"), (List{"localhost:5000"}));
  EXPECT_EQ(ExpandPsAddresses("127.0.0.1:5000"), (List{"127.0.0.1:5000"}));
}

// The grouping itself, on made-up resolutions: this host's localhost may
// have one family only.
TEST(ExpandPsAddressesTest, AddressesAreGroupedByFamily) {
  auto shards = [](std::vector<ResolvedAddress> resolved) {
    return ShardsOfResolvedName("dp-ps:5000", "5000", resolved);
  };
  // One address per family: one dp-ps, by its name.
  EXPECT_EQ(shards({{false, "127.0.0.1"}, {true, "::1"}}),
            (List{"dp-ps:5000"}));
  EXPECT_EQ(shards({{false, "10.0.0.1"}}), (List{"dp-ps:5000"}));
  EXPECT_EQ(shards({}), (List{"dp-ps:5000"}));
  // getaddrinfo's repeats (one per socket type) are one address.
  EXPECT_EQ(shards({{false, "10.0.0.1"}, {false, "10.0.0.1"}}),
            (List{"dp-ps:5000"}));
  // Several in one family: the shards, in the resolver's order.
  EXPECT_EQ(shards({{false, "10.0.0.2"}, {false, "10.0.0.1"}}),
            (List{"ipv4:10.0.0.2:5000", "ipv4:10.0.0.1:5000"}));
  EXPECT_EQ(shards({{true, "fd00::1"}, {false, "10.0.0.1"}, {true, "fd00::2"}}),
            (List{"ipv6:[fd00::1]:5000", "ipv6:[fd00::2]:5000"}));
  // Both families with several (a dual-stack headless Service): IPv4's.
  EXPECT_EQ(shards({{true, "fd00::1"},
                    {true, "fd00::2"},
                    {false, "10.0.0.1"},
                    {false, "10.0.0.2"}}),
            (List{"ipv4:10.0.0.1:5000", "ipv4:10.0.0.2:5000"}));
}

TEST(ExpandPsAddressesTest, UrisAndUnresolvableNamesStayAsGiven) {
  EXPECT_EQ(ExpandPsAddresses("dns:///dp-ps:5000"),
            (List{"dns:///dp-ps:5000"}));
  EXPECT_EQ(ExpandPsAddresses("no-such-host.invalid:5000"),
            (List{"no-such-host.invalid:5000"}));
  EXPECT_EQ(ExpandPsAddresses("[::1]:5000"), (List{"[::1]:5000"}));
}

}  // namespace
}  // namespace dp
