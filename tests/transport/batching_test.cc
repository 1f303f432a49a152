// The send queue's economy on a real device (tag "rdma"): messages nobody waits on cost no send
// completion, answers sent while a batch of requests is dispatched leave in one doorbell (and the
// requests' receives go back in chains), a window released by returning credits leaves in
// chains, and Flush/Probe still find the peer behind an unsignalled tail. Counted with the
// connection's own stats (work requests, signalled, doorbells), which count what was handed to
// ibv_post_send.
#include <atomic>
#include <catch2/catch.hpp>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>

#include "tests/log_capture.h"
#include "tests/pattern.h"
#include "tests/rdma_device.h"
#include "tests/transport/connected_pair.h"
#include "tests/transport/recorder.h"
#include "transport/connection.h"
#include "transport/poller.h"

namespace {

using namespace zrpc::transport;  // NOLINT: a test of this namespace
using zrpc::testing::ConnectPair;
using zrpc::testing::Filled;
using zrpc::testing::kTimeout;
using zrpc::testing::Pair;
using zrpc::testing::Recorder;
using zrpc::testing::Setup;

// Answers every message with `replies` copies of it, sent without a token from the handler (on
// the poller thread, inside the completion batch), then releases it.
class Replier : public Recorder {
 public:
  explicit Replier(int replies) : replies_(replies) {}
  void OnMessage(Connection& c, const ReceivedMessage& m) override {
    for (int i = 0; i < replies_; ++i) {
      auto buffer = c.AcquireSendBuffer();
      if (!buffer.ok()) {
        ++failures;
        continue;
      }
      std::memcpy(buffer->data, m.data, m.size);
      if (!c.Send(*buffer, m.size).ok()) ++failures;
    }
    Recorder::OnMessage(c, m);
  }
  std::atomic<int> failures{0};

 private:
  const int replies_;
};

absl::Status SendUnreported(Connection& c, const std::string& payload) {
  auto buffer = c.AcquireSendBuffer();
  if (!buffer.ok()) return buffer.status();
  std::memcpy(buffer->data, payload.data(), payload.size());
  return c.Send(*buffer, static_cast<uint32_t>(payload.size()));
}

// Waits until `c` has nothing outstanding.
bool Drains(Connection& c) {
  const absl::Time deadline = absl::Now() + kTimeout;
  while (absl::Now() < deadline) {
    if (c.stats().sends_outstanding == 0) return true;
    absl::SleepFor(absl::Milliseconds(1));
  }
  return false;
}

// A pair whose server application holds every message it receives (so no credit comes back
// until the test releases them), granting the client `recv_credits`.
Pair ConnectHolding(Setup& setup, Recorder& server_handler, Recorder& client_handler,
                    uint32_t recv_credits) {
  server_handler.hold = true;
  ConnectionOptions server_options;
  server_options.recv_credits = recv_credits;
  return ConnectPair(setup, &server_handler, &client_handler, server_options);
}

// Gives every message back twice from its handler, on the poller: the first release reposts the
// receive at once (the handler's batch holds the domain), the second is a caller's bug, refused.
class DoubleReleaser : public ConnectionHandler {
 public:
  void OnMessage(Connection& c, const ReceivedMessage& m) override {
    const std::string expected = Filled(100, next_);
    if (m.size != expected.size() || std::memcmp(m.data, expected.data(), m.size) != 0) ++bad;
    ++next_;
    if (!c.Release(m.handle).ok()) ++failures;
    // In the batch the handler holds the connection's domain: the second is refused at once.
    if (c.Release(m.handle).code() != absl::StatusCode::kFailedPrecondition) ++failures;
    received.fetch_add(1);
  }
  void OnBulk(Connection&, const ReceivedBulk&) override {}
  void OnSendDone(Connection&, uint64_t, const absl::Status&) override {}
  void OnClosed(Connection&, const absl::Status&) override { closed = true; }

  std::atomic<uint64_t> received{0};
  std::atomic<int> bad{0}, failures{0};
  std::atomic<bool> closed{false};

 private:
  uint64_t next_ = 0;  // the poller's only
};

TEST_CASE(
    "a message given back twice from its handler is refused the second time and posted again "
    "once, and traffic goes on intact",
    "[rdma][transport]") {
  ZRPC_REQUIRE_RDMA_DEVICE(config);
  zrpc::testing::LogCapture log(zrpc::LogLevel::kError);
  constexpr uint64_t kMessages = 200;
  DoubleReleaser server_handler;
  Recorder client_handler;
  Setup setup(config);
  ConnectionOptions options;
  options.recv_credits = 4;  // every slot comes round 50 times: one posted twice would show
  Pair pair = ConnectPair(setup, &server_handler, &client_handler, options, options);
  for (uint64_t i = 0; i < kMessages; ++i) {
    REQUIRE(zrpc::testing::SendBytes(*pair.client, Filled(100, i), i).ok());
  }
  const absl::Time deadline = absl::Now() + kTimeout;
  while (server_handler.received < kMessages && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(1));
  }
  CHECK(server_handler.received == kMessages);
  CHECK(server_handler.bad == 0);
  CHECK(server_handler.failures == 0);
  CHECK_FALSE(server_handler.closed);
  CHECK(pair.server->open());
  CHECK(log.Count(zrpc::LogLevel::kError, "transport", "released twice") == 0);
  REQUIRE(client_handler.WaitFor([&] { return client_handler.done.size() == kMessages; }));
  absl::MutexLock lock(&client_handler.mu);
  for (auto& [token, status] : client_handler.done) CHECK(status.ok());
}

}  // namespace

TEST_CASE(
    "a ping-pong of messages sent without a token signals one in kSignalInterval, and "
    "Flush and Probe still get a completion behind the unsignalled tail",
    "[rdma][transport]") {
  ZRPC_REQUIRE_RDMA_DEVICE(config);
  constexpr int kRounds = 200;
  constexpr uint32_t kSize = 64;
  Replier server_handler(1);
  Recorder client_handler;
  client_handler.keep_bytes = false;
  Setup setup(config);
  Pair pair = ConnectPair(setup, &server_handler, &client_handler);
  const ConnectionStats client_before = pair.client->stats();
  const ConnectionStats server_before = pair.server->stats();
  for (int i = 0; i < kRounds; ++i) {
    REQUIRE(SendUnreported(*pair.client, Filled(kSize, i)).ok());
    REQUIRE(
        client_handler.WaitFor([&] { return client_handler.message_count == uint64_t(i + 1); }));
  }
  CHECK(server_handler.failures == 0);
  const ConnectionStats client = pair.client->stats();
  const ConnectionStats server = pair.server->stats();
  for (const auto& [name, before, after] :
       {std::tuple{"client", client_before, client}, std::tuple{"server", server_before, server}}) {
    const uint64_t wrs = after.work_requests - before.work_requests;
    const uint64_t signalled = after.signalled - before.signalled;
    INFO(name << ": " << wrs << " work requests, " << signalled << " signalled");
    CHECK(after.messages_sent - before.messages_sent == kRounds);
    CHECK(wrs >= kRounds);  // and any credit frames
    // Every kSignalInterval-th, and the credit frames (signalled: their slot is shared).
    const uint64_t credit_frames = after.credit_frames_sent - before.credit_frames_sent;
    CHECK(signalled <= kRounds / kSignalInterval + credit_frames + 1);
  }
  {
    absl::MutexLock lock(&client_handler.mu);
    CHECK(client_handler.done.empty());  // no OnSendDone for messages sent without a token
  }
  // The tail is unsignalled now (200 is not a multiple of 16): Flush asks for a completion and
  // everything retires; a Probe behind an unsignalled tail posts.
  const uint64_t probes = pair.client->stats().probes_sent;
  REQUIRE(SendUnreported(*pair.client, Filled(kSize, 1)).ok());
  REQUIRE(client_handler.WaitFor([&] { return client_handler.message_count == kRounds + 1; }));
  REQUIRE(pair.client->Probe().ok());
  CHECK(pair.client->stats().probes_sent == probes + 1);
  REQUIRE(SendUnreported(*pair.server, Filled(kSize, 2)).ok());
  REQUIRE(pair.server->Flush().ok());
  CHECK(Drains(*pair.server));
  CHECK(Drains(*pair.client));
  // With nothing in flight a Flush posts nothing, a Probe does.
  const uint64_t wrs = pair.server->stats().work_requests;
  REQUIRE(pair.server->Flush().ok());
  CHECK(pair.server->stats().work_requests == wrs);
  REQUIRE(pair.server->Probe().ok());
  CHECK(pair.server->stats().work_requests == wrs + 1);
}

TEST_CASE("the answers handlers send during a batch of requests leave in one doorbell",
          "[rdma][transport]") {
  ZRPC_REQUIRE_RDMA_DEVICE(config);
  constexpr int kRequests = 8;
  constexpr int kRounds = 4;
  Replier server_handler(1);
  Recorder client_handler;
  Setup setup(config);
  // The server's connection goes on a poller this test drives (RunOnce), so that the requests
  // are all in its completion queue before it looks: they come out as one batch.
  auto manual = Poller::Create(*setup.device);
  REQUIRE(manual.ok());
  setup.accepts->Use(manual->get(), &server_handler);
  std::atomic<bool> accepted{false};
  std::thread driver([&] {
    while (!accepted) (*manual)->RunOnce(absl::Milliseconds(1));
  });
  auto client =
      Connection::Connect(*setup.device, *setup.client_poller, setup.device->selection().addr,
                          setup.listener->port(), &client_handler, {}, kTimeout);
  auto server = setup.accepts->Next(kTimeout);
  accepted = true;
  driver.join();
  REQUIRE(client.ok());
  REQUIRE(server.ok());
  uint64_t replies = 0, doorbells = 0, credit_frames = 0, batches = 0, recv_doorbells = 0,
           recvs_posted = 0;
  for (int round = 0; round < kRounds; ++round) {
    const ConnectionStats before = (*server)->stats();
    for (int i = 0; i < kRequests; ++i) {
      REQUIRE(SendUnreported(**client, Filled(100, round * kRequests + i)).ok());
    }
    absl::SleepFor(absl::Milliseconds(200));  // all arrive before the server polls
    const uint64_t want = uint64_t((round + 1) * kRequests);
    const absl::Time deadline = absl::Now() + kTimeout;
    for (;;) {
      uint64_t had;
      {
        absl::MutexLock lock(&server_handler.mu);
        had = server_handler.message_count;
      }
      if (had == want || absl::Now() > deadline) break;
      (*manual)->RunOnce(absl::Milliseconds(1));
      absl::MutexLock lock(&server_handler.mu);
      if (server_handler.message_count > had) ++batches;
    }
    const ConnectionStats after = (*server)->stats();
    replies += after.messages_sent - before.messages_sent;
    doorbells += after.doorbells - before.doorbells;
    credit_frames += after.credit_frames_sent - before.credit_frames_sent;
    recv_doorbells += after.recv_doorbells - before.recv_doorbells;
    recvs_posted += after.recvs_posted - before.recvs_posted;
  }
  std::printf(
      "%lu replies in %lu batches: %lu doorbells, %lu credit frames; %lu receives reposted with "
      "%lu receive doorbells\n",
      static_cast<unsigned long>(replies), static_cast<unsigned long>(batches),
      static_cast<unsigned long>(doorbells), static_cast<unsigned long>(credit_frames),
      static_cast<unsigned long>(recvs_posted), static_cast<unsigned long>(recv_doorbells));
  CHECK(server_handler.failures == 0);
  CHECK(replies == kRounds * kRequests);
  // One doorbell for the answers of each batch (and one for any credit frame on its own).
  CHECK(doorbells <= batches + credit_frames);
  CHECK(batches < replies);  // and the requests did come in batches
  // The requests' receives go back in chains too: those released before the last handler's
  // answer opened the cork go with it, the last one's at the batch's end; a credit frame from the
  // client comes alone, and its receive goes back alone. (Before: one ibv_post_recv per receive,
  // 33 for 32 requests and a credit frame.)
  REQUIRE(recvs_posted >= replies);
  CHECK(recv_doorbells <= 2 * batches + (recvs_posted - replies));
  REQUIRE(client_handler.WaitFor(
      [&] { return client_handler.message_count == uint64_t(kRounds * kRequests); }));
  {
    absl::MutexLock lock(&client_handler.mu);
    for (int i = 0; i < kRounds * kRequests; ++i) {
      CHECK(client_handler.messages[i] == Filled(100, i));
    }
  }
  (*server)->Close();
  for (int i = 0;
       i < 100 && !server_handler.WaitFor([&] { return server_handler.closed.has_value(); },
                                          absl::ZeroDuration());
       ++i) {
    (*manual)->RunOnce(absl::Milliseconds(10));
  }
  server->reset();
  client->reset();
}

TEST_CASE("a window that waited for credits leaves in chains as they come back, in order",
          "[rdma][transport]") {
  ZRPC_REQUIRE_RDMA_DEVICE(config);
  constexpr int kMessages = 96;
  Recorder server_handler, client_handler;
  Setup setup(config);
  Pair pair = ConnectHolding(setup, server_handler, client_handler, 32);
  for (int i = 0; i < kMessages; ++i) {
    REQUIRE(SendUnreported(*pair.client, Filled(200, i)).ok());
  }
  // 31 went (the last credit is kept for credit frames); the rest wait.
  REQUIRE(server_handler.WaitFor([&] { return server_handler.message_count == 31; }));
  CHECK(pair.client->stats().waiting == kMessages - 31);
  const ConnectionStats before = pair.client->stats();
  // Released all at once, as a server's handlers finishing a burst would: the credits come back
  // together and the waiting window leaves in chains, not one doorbell per message.
  for (;;) {
    std::vector<uint64_t> held;
    {
      absl::MutexLock lock(&server_handler.mu);
      held.swap(server_handler.held);
      if (held.empty() && server_handler.message_count == kMessages) break;
    }
    for (uint64_t handle : held) REQUIRE(pair.server->Release(handle).ok());
    if (held.empty()) absl::SleepFor(absl::Milliseconds(1));
  }
  const ConnectionStats after = pair.client->stats();
  const uint64_t doorbells = after.doorbells - before.doorbells;
  INFO(doorbells << " doorbells for " << kMessages - 31 << " waiting messages");
  CHECK(doorbells < (kMessages - 31) / 2);
  absl::MutexLock lock(&server_handler.mu);
  REQUIRE(server_handler.messages.size() == kMessages);
  for (int i = 0; i < kMessages; ++i) CHECK(server_handler.messages[i] == Filled(200, i));
}

TEST_CASE(
    "a message someone waits on, followed in one chain by one nobody waits on, still gets "
    "its completion without more traffic",
    "[rdma][transport]") {
  ZRPC_REQUIRE_RDMA_DEVICE(config);
  Recorder server_handler, client_handler;
  Setup setup(config);
  Pair pair = ConnectHolding(setup, server_handler, client_handler, 8);
  // Seven go (the eighth credit is kept for credit frames), all without a token.
  for (int i = 0; i < 7; ++i) REQUIRE(SendUnreported(*pair.client, Filled(100, i)).ok());
  REQUIRE(server_handler.WaitFor([&] { return server_handler.message_count == 7; }));
  // These two wait for credits, then leave in one chain: the first reports (token 99), the
  // second does not. The first must not be left unsignalled because the second follows it.
  auto buffer = pair.client->AcquireSendBuffer();
  REQUIRE(buffer.ok());
  std::memcpy(buffer->data, Filled(100, 7).data(), 100);
  REQUIRE(pair.client->Send(*buffer, 100, /*token=*/99).ok());
  REQUIRE(SendUnreported(*pair.client, Filled(100, 8)).ok());
  CHECK(pair.client->stats().waiting == 2);
  std::vector<uint64_t> held;
  {
    absl::MutexLock lock(&server_handler.mu);
    held.swap(server_handler.held);
  }
  for (uint64_t handle : held) REQUIRE(pair.server->Release(handle).ok());
  REQUIRE(server_handler.WaitFor([&] { return server_handler.message_count == 9; }));
  // No traffic follows: OnSendDone(99) comes from the chain's own signalled completion, or never.
  CHECK(
      client_handler.WaitFor([&] { return client_handler.done.count(99) == 1; }, absl::Seconds(5)));
  absl::MutexLock lock(&client_handler.mu);
  CHECK(client_handler.done.size() == 1);
}
