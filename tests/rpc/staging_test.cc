// The staging pool (rpc/bulk/staging.h) over fakeverbs, on the host: buffers by size class,
// page-aligned whole pages (registration pins whole pages: an unaligned 4 KiB buffer pinned two),
// kept for reuse, and bounded.
#include "rpc/bulk/staging.h"

#include <catch2/catch.hpp>
#include <cstdint>

#include "tests/fakeverbs/fake_device.h"
#include "transport/device.h"

namespace {

using zrpc::internal::StagingPool;

TEST_CASE("staging buffers are whole pages, page-aligned, kept for reuse, and bounded") {
  auto device = zrpc::transport::Device::Open(zrpc::fakeverbs::FakeDevice());
  INFO(device.status());
  REQUIRE(device.ok());
  StagingPool pool(**device, 64 << 10);
  for (size_t size : {size_t{1}, size_t{100}, size_t{4096}, size_t{4097}, size_t{40000}}) {
    INFO("a payload of " << size << " bytes");
    auto buffer = pool.Acquire(size);
    REQUIRE(buffer.ok());
    CHECK(reinterpret_cast<uintptr_t>((*buffer)->data) % 4096 == 0);
    CHECK((*buffer)->capacity % 4096 == 0);
    CHECK((*buffer)->capacity >= size);
    CHECK((*buffer)->capacity == StagingPool::CapacityFor(size));
    pool.Release(*buffer);
  }
  CHECK(pool.in_use() == 0);
  CHECK(pool.registered_bytes() <= size_t{64} << 10);
  // A released buffer is kept and handed out again: nothing registered the second time.
  auto first = pool.Acquire(100);
  REQUIRE(first.ok());
  pool.Release(*first);
  const size_t registered = pool.registered_bytes();
  auto again = pool.Acquire(200);
  REQUIRE(again.ok());
  CHECK(*again == *first);
  CHECK(pool.registered_bytes() == registered);
  // At the bound: a 64 KiB buffer does not fit beside the 4 KiB one held, and free ones are
  // let go of first.
  auto refused = pool.Acquire(60 << 10);
  CHECK(refused.status().code() == absl::StatusCode::kResourceExhausted);
  pool.Release(*again);
  auto big = pool.Acquire(60 << 10);
  REQUIRE(big.ok());
  CHECK(pool.registered_bytes() == size_t{64} << 10);
  pool.Release(*big);
}

}  // namespace
