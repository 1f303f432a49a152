#include "transport/device_config.h"

#include <catch2/catch.hpp>
#include <map>
#include <string>

using zrpc::transport::ParseDeviceConfig;

namespace {

auto Env(std::map<std::string, std::string> vars) {
  return [vars = std::move(vars)](const char* name) -> const char* {
    auto it = vars.find(name);
    return it == vars.end() ? nullptr : it->second.c_str();
  };
}

}  // namespace

TEST_CASE("device config reads what tools/softroce exports", "[transport][config]") {
  auto config = ParseDeviceConfig(Env({{"ZRPC_RDMA_DEVICE", "rxe0"},
                                       {"ZRPC_RDMA_PORT", "1"},
                                       {"ZRPC_RDMA_GID_INDEX", "1"},
                                       {"ZRPC_RDMA_ADDR", "198.18.0.1"},
                                       {"ZRPC_SOFTROCE_MODE", "vm"}}));
  REQUIRE(config.ok());
  CHECK(config->device == "rxe0");
  CHECK(config->port == 1);
  CHECK(config->gid_index == 1);
  CHECK(config->addr == "198.18.0.1");
  CHECK(config->from_harness);
}

TEST_CASE("device config defaults everything but the address", "[transport][config]") {
  auto config = ParseDeviceConfig(Env({{"ZRPC_RDMA_ADDR", "fd00::1"}}));
  REQUIRE(config.ok());
  CHECK(config->device.empty());
  CHECK(config->port == 1);
  CHECK(config->gid_index == -1);
  CHECK_FALSE(config->from_harness);
}

TEST_CASE("device config without an address is NotFound", "[transport][config]") {
  CHECK(ParseDeviceConfig(Env({})).status().code() == absl::StatusCode::kNotFound);
  CHECK(ParseDeviceConfig(Env({{"ZRPC_RDMA_ADDR", ""}})).status().code() ==
        absl::StatusCode::kNotFound);
}

TEST_CASE("device config rejects malformed numbers, naming the variable", "[transport][config]") {
  for (const char* bad : {"x", "0", "256", "1x", "-3", "99999999999"}) {
    auto config =
        ParseDeviceConfig(Env({{"ZRPC_RDMA_ADDR", "198.18.0.1"}, {"ZRPC_RDMA_PORT", bad}}));
    INFO("ZRPC_RDMA_PORT=" << bad);
    REQUIRE_FALSE(config.ok());
    CHECK(config.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK(std::string(config.status().message()).find("ZRPC_RDMA_PORT") != std::string::npos);
  }
  auto gid = ParseDeviceConfig(Env({{"ZRPC_RDMA_ADDR", "a"}, {"ZRPC_RDMA_GID_INDEX", "-2"}}));
  CHECK(gid.status().code() == absl::StatusCode::kInvalidArgument);
}
