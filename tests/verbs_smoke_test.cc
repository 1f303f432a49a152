// The foundation's proof that verbs work where tests run: two RC queue pairs, connected through
// librdmacm on the harness's address, move one SEND and one 1 MiB RDMA WRITE_WITH_IMM, and the
// receiver checks every byte. Needs a device (tag "rdma"); tools/test runs it in tools/softroce.
#include <catch2/catch.hpp>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <thread>

#include "tests/pattern.h"
#include "tests/rdma_device.h"
#include "transport/rc_endpoint.h"

namespace {

using zrpc::testing::Fill;
using zrpc::transport::Completion;
using zrpc::transport::RcEndpoint;
using zrpc::transport::RcListener;
using zrpc::transport::RcOptions;

constexpr size_t kMiB = 1 << 20;
constexpr uint32_t kRecvSize = 64 * 1024;  // receive slots occupy [0, 4 * kRecvSize)
constexpr size_t kSendArea = 2 * kMiB;     // where the client stages what it sends
constexpr size_t kWriteTarget = 1 * kMiB;  // where the 1 MiB lands in the server's buffer
constexpr absl::Duration kTimeout = absl::Seconds(30);

RcOptions Options() {
  RcOptions options;
  options.buffer_size = 4 * kMiB;
  options.initial_recvs = 4;
  options.recv_size = kRecvSize;
  return options;
}

}  // namespace

TEST_CASE("two RC queue pairs exchange a SEND and a 1 MiB RDMA WRITE_WITH_IMM", "[rdma][smoke]") {
  ZRPC_REQUIRE_RDMA_DEVICE(device);

  auto listener = RcListener::Create(device.addr, 0);
  REQUIRE(listener.ok());
  absl::StatusOr<std::unique_ptr<RcEndpoint>> server = absl::UnknownError("not accepted");
  std::thread acceptor([&] { server = (*listener)->Accept(Options(), kTimeout); });
  auto client = RcEndpoint::Connect(device.addr, (*listener)->port(), Options(), kTimeout);
  acceptor.join();
  INFO("client: " << client.status() << ", server: " << server.status());
  REQUIRE(client.ok());
  REQUIRE(server.ok());
  RcEndpoint& c = **client;
  RcEndpoint& s = **server;

  auto gid_index = c.GidIndex();
  REQUIRE(gid_index.ok());
  std::printf("verbs smoke: device %s port %d gid %s (index %d), max inline %u, %s:%u\n",
              c.DeviceName().c_str(), c.PortNum(), c.GidText().c_str(), *gid_index,
              c.max_inline(), device.addr.c_str(), static_cast<unsigned>((*listener)->port()));
  if (!device.device.empty()) CHECK(c.DeviceName() == device.device);
  // The harness's GID description must match what librdmacm resolved from the address.
  if (device.gid_index >= 0) CHECK(*gid_index == device.gid_index);

  SECTION("SEND into a posted RECV, inline and not") {
    for (size_t len : {size_t{0}, size_t{1}, size_t{c.max_inline()}, size_t{kRecvSize}}) {
      INFO("SEND of " << len << " bytes");
      static uint64_t wr = 100;
      ++wr;
      Fill(c.buffer() + kSendArea, len, wr);
      REQUIRE(c.PostSend(kSendArea, len, wr, /*signaled=*/true).ok());
      auto sent = c.Poll(kTimeout);
      REQUIRE(sent.ok());
      CHECK(sent->kind == Completion::Kind::kSend);
      CHECK(sent->wr_id == wr);

      auto got = s.Poll(kTimeout);
      REQUIRE(got.ok());
      CHECK(got->kind == Completion::Kind::kRecv);
      CHECK(got->byte_len == len);
      REQUIRE(got->wr_id < 4);
      const uint8_t* slot = s.buffer() + got->wr_id * kRecvSize;
      CHECK(std::memcmp(slot, c.buffer() + kSendArea, len) == 0);
      // Give the slot back, as a transport would.
      REQUIRE(s.PostRecv(got->wr_id * kRecvSize, kRecvSize, got->wr_id).ok());
    }
  }

  SECTION("1 MiB RDMA WRITE_WITH_IMM lands byte for byte, and nothing around it moves") {
    uint8_t* target = s.buffer() + kWriteTarget;
    std::memset(target - 4096, 0xAB, 4096);  // guard bands on both sides
    std::memset(target + kMiB, 0xCD, 4096);
    Fill(c.buffer() + kSendArea, kMiB, 7);
    REQUIRE(c.PostWrite(kSendArea, kMiB, kWriteTarget, /*wr_id=*/200, /*signaled=*/true,
                        /*with_imm=*/true, /*imm=*/static_cast<uint32_t>(kWriteTarget))
                .ok());
    auto written = c.Poll(kTimeout);
    REQUIRE(written.ok());
    CHECK(written->kind == Completion::Kind::kWrite);
    CHECK(written->wr_id == 200);

    auto arrived = s.Poll(kTimeout);
    REQUIRE(arrived.ok());
    CHECK(arrived->kind == Completion::Kind::kRecvWithImm);
    CHECK(arrived->imm == kWriteTarget);
    CHECK(arrived->byte_len == kMiB);
    CHECK(std::memcmp(target, c.buffer() + kSendArea, kMiB) == 0);
    size_t first_bad = kMiB;
    for (size_t i = 0; i < kMiB; ++i) {
      if (target[i] != c.buffer()[kSendArea + i]) {
        first_bad = i;
        break;
      }
    }
    CHECK(first_bad == kMiB);
    bool guards_intact = true;
    for (size_t i = 0; i < 4096; ++i) {
      guards_intact &= target[-1 - static_cast<ptrdiff_t>(i)] == 0xAB && target[kMiB + i] == 0xCD;
    }
    CHECK(guards_intact);
  }

  SECTION("a WRITE past the peer's advertised buffer is refused before it is posted") {
    auto s2 = c.PostWrite(kSendArea, kMiB, c.peer().size - kMiB + 1, 300, true, false, 0);
    CHECK(s2.code() == absl::StatusCode::kOutOfRange);
  }
}
