// The examples' command-line helpers and CRC-32C (host test).
#include "examples/cli.h"

#include <catch2/catch.hpp>

#include "examples/crc32c.h"

namespace cli = zrpc::examples::cli;

TEST_CASE("host:port parses IPv4, bracketed IPv6 and an empty address, and nothing else",
          "[examples]") {
  auto v4 = cli::ParseHostPort("198.18.0.1:7471");
  REQUIRE(v4.has_value());
  CHECK(v4->address == "198.18.0.1");
  CHECK(v4->port == 7471);
  auto v6 = cli::ParseHostPort("[fe80::1]:0");
  REQUIRE(v6.has_value());
  CHECK(v6->address == "fe80::1");
  CHECK(v6->port == 0);
  auto any = cli::ParseHostPort(":7471");
  REQUIRE(any.has_value());
  CHECK(any->address.empty());
  CHECK(cli::FormatHostPort("fe80::1", 7) == "[fe80::1]:7");
  CHECK(cli::FormatHostPort("198.18.0.1", 7) == "198.18.0.1:7");
  for (const char* bad : {"", "198.18.0.1", "198.18.0.1:", "198.18.0.1:65536", "fe80::1:7",
                          "[fe80::1:7", "198.18.0.1:+7", "198.18.0.1: 7", "host:7x"}) {
    INFO(bad);
    CHECK_FALSE(cli::ParseHostPort(bad).has_value());
  }
  CHECK(cli::IsTarget("198.18.0.1:7471"));
  CHECK_FALSE(cli::IsTarget(":7471"));
  CHECK_FALSE(cli::IsTarget("198.18.0.1:0"));
}

TEST_CASE("byte counts take K, M and G suffixes and stay in range", "[examples]") {
  CHECK(cli::ParseBytes("4096", 0, 1 << 30) == 4096u);
  CHECK(cli::ParseBytes("64K", 0, 1 << 30) == 64u << 10);
  CHECK(cli::ParseBytes("4M", 0, 1 << 30) == 4u << 20);
  CHECK(cli::ParseBytes("1G", 0, 1 << 30) == 1u << 30);
  for (const char* bad :
       {"", "M", "2G", "1073741825", "-1", "1.5M", "4m", "99999999999999999999K"}) {
    INFO(bad);
    CHECK_FALSE(cli::ParseBytes(bad, 0, 1 << 30).has_value());
  }
  CHECK_FALSE(cli::ParseBytes("32", 64, 1 << 30).has_value());
}

TEST_CASE("CRC-32C matches the published check value", "[examples]") {
  CHECK(zrpc::examples::Crc32c("123456789") == 0xE3069283u);
  CHECK(zrpc::examples::Crc32c("") == 0u);
}
