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

TEST(ExpandPsAddressesTest, UrisAndUnresolvableNamesStayAsGiven) {
  EXPECT_EQ(ExpandPsAddresses("dns:///dp-ps:5000"),
            (List{"dns:///dp-ps:5000"}));
  EXPECT_EQ(ExpandPsAddresses("no-such-host.invalid:5000"),
            (List{"no-such-host.invalid:5000"}));
  EXPECT_EQ(ExpandPsAddresses("[::1]:5000"), (List{"[::1]:5000"}));
}

}  // namespace
}  // namespace dp
