// Mixed traffic between two hosts while the link loses frames (tag "two_hosts"): small calls,
// bulk both ways in the arena (4 KiB) and pulled past it (1 MiB each way), and bidirectional
// streams, from four threads in guest a to rpc_peer's mixed server in guest b. First lossless,
// then at 0.1 %, 1 % and 5 % of frames lost both ways (seeded), each for ZRPC_LOSS_SECONDS
// (20 s by default; issue 36 asks for a minute, run outside CI:
//   tools/test --test_env=ZRPC_LOSS_SECONDS=60 ...).
// Checked at each level: no call or stream fails, every answer is the right one, the connection
// stays; goodput (bulk bytes moved a second) at 1 % is at least half the lossless figure; and
// once the traffic stops, what each side has pinned for registrations is within 5 % of what it
// pinned after the lossless run, and this side's verbs objects (rdma res) are as many as then,
// but for memory regions of staging buffers the channel registered meanwhile (its staging pool
// keeps a buffer it needed, up to ChannelOptions::staging_bytes, and under loss more payloads
// wait for their WRITE's completion at once): nothing leaked under loss.
#include <atomic>
#include <catch2/catch.hpp>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "proto/examples/greeter.zrpc.h"
#include "proto/examples/numbers.zrpc.h"
#include "proto/examples/object_store.zrpc.h"
#include "rpc/channel.h"
#include "tests/hosts/two_hosts.h"
#include "tests/pattern.h"
#include "tests/pinned_memory.h"

namespace {

using zrpc::examples::Greeter;
using zrpc::examples::Number;
using zrpc::examples::Numbers;
using zrpc::examples::ObjectInfo;
using zrpc::examples::ObjectKey;
using zrpc::examples::ObjectStore;
using zrpc::testing::Link;
using zrpc::testing::LinkCount;
using zrpc::testing::RemotePeer;
using zrpc::testing::Runfile;

constexpr size_t kSmall = 4 << 10;  // within the peer's arena: written in place
constexpr size_t kLarge = 1 << 20;  // past it (256 KiB): pulled, each way
constexpr int kStreamNumbers = 32;  // per stream, each answered as it comes
constexpr absl::Duration kDeadline = absl::Seconds(30);
// A channel's smallest staging buffer (StagingPool::kMinBuffer, rpc/bulk/staging.h).
constexpr uint64_t kSmallestStagingBuffer = 4096;

absl::Duration LevelTime() {
  const char* text = std::getenv("ZRPC_LOSS_SECONDS");
  int seconds = 0;
  if (text != nullptr && absl::SimpleAtoi(text, &seconds) && seconds > 0) {
    return absl::Seconds(seconds);
  }
  return absl::Seconds(20);
}

// What a run of traffic did.
struct Tally {
  std::atomic<uint64_t> operations{0};  // calls and whole streams that ended
  std::atomic<uint64_t> failed{0};      // of those, ended with an error or a wrong answer
  std::atomic<uint64_t> bulk_bytes{0};  // payload bytes moved, both ways, by calls that succeeded
  absl::Mutex mu;
  std::string first_failure;  // under mu

  void Fail(const std::string& what) {
    failed.fetch_add(1);
    absl::MutexLock lock(&mu);
    if (first_failure.empty()) first_failure = what;
  }
};

// Four kinds of traffic, one thread each, until `until`.
void RunTraffic(zrpc::ClientChannel* channel, absl::Time until, Tally& tally) {
  auto hello = [&] {
    Greeter::Stub stub(channel);
    zrpc::examples::HelloRequest request;
    request.set_name("mixed");
    while (absl::Now() < until) {
      zrpc::examples::HelloReply reply;
      const absl::Status s = stub.SayHello(request, &reply, zrpc::CallOptions::Timeout(kDeadline));
      tally.operations.fetch_add(1);
      if (!s.ok())
        tally.Fail(absl::StrCat("SayHello: ", s.ToString()));
      else if (reply.message() != "Hello, mixed")
        tally.Fail("SayHello: " + reply.message());
    }
  };
  auto transform = [&](size_t size) {
    ObjectStore::Stub stub(channel);
    ObjectKey key;
    key.set_name("t");
    for (uint64_t seed = 1; absl::Now() < until; ++seed) {
      const std::string object = zrpc::testing::Filled(size, seed);
      ObjectInfo info;
      zrpc::IncomingBulk reversed;
      const absl::Status s =
          stub.Transform(key, zrpc::OutgoingBulk(object.data(), object.size()), &info, &reversed,
                         zrpc::CallOptions::Timeout(kDeadline));
      tally.operations.fetch_add(1);
      if (!s.ok()) {
        tally.Fail(absl::StrCat("Transform ", size, ": ", s.ToString()));
      } else if (reversed.view() != std::string(object.rbegin(), object.rend())) {
        tally.Fail(absl::StrCat("Transform ", size, ": a wrong answer"));
      } else {
        tally.bulk_bytes.fetch_add(2 * size);
      }
    }
  };
  auto stream = [&] {
    Numbers::Stub stub(channel);
    while (absl::Now() < until) {
      zrpc::ClientReaderWriter<Number, Number> chat =
          stub.Double(zrpc::CallOptions::Timeout(kDeadline));
      std::string wrong;
      for (int i = 1; i <= kStreamNumbers && wrong.empty(); ++i) {
        Number number;
        number.set_value(i);
        if (!chat.Write(number)) {
          wrong = absl::StrCat("write ", i, " failed");
        } else if (!chat.Read(&number)) {
          wrong = absl::StrCat("read ", i, " failed");
        } else if (number.value() != 2u * i) {
          wrong = absl::StrCat("read ", number.value(), " for ", i);
        }
      }
      if (wrong.empty() && !chat.WritesDone()) wrong = "WritesDone failed";
      const absl::Status s = chat.Finish();
      tally.operations.fetch_add(1);
      if (!s.ok() || !wrong.empty()) tally.Fail(absl::StrCat("Double: ", wrong, " ", s.ToString()));
    }
  };
  std::vector<std::thread> threads;
  threads.emplace_back(hello);
  threads.emplace_back(transform, kSmall);
  threads.emplace_back(transform, kLarge);
  threads.emplace_back(stream);
  for (std::thread& thread : threads) thread.join();
}

// This guest's verbs objects by kind ("qp", "mr", ...), from `rdma resource show`; empty when
// the tool says nothing readable.
std::map<std::string, int64_t> VerbsObjects() {
  std::map<std::string, int64_t> counts;
  std::FILE* out = popen("rdma resource show 2>/dev/null", "r");
  if (out == nullptr) return counts;
  char line[512];
  while (std::fgets(line, sizeof(line), out) != nullptr) {
    // "0: rxe0: pd 3 cq 3 qp 2 cm_id 1 mr 5 ctx 1 srq 0"
    std::vector<std::string> words =
        absl::StrSplit(line, absl::ByAnyChar(" \n"), absl::SkipEmpty());
    for (size_t i = 2; i + 1 < words.size(); i += 2) {
      int64_t n = 0;
      if (absl::SimpleAtoi(words[i + 1], &n)) counts[words[i]] += n;
    }
  }
  pclose(out);
  return counts;
}

std::string Describe(const std::map<std::string, int64_t>& counts) {
  std::string text;
  for (const auto& [kind, n] : counts) absl::StrAppend(&text, kind, " ", n, " ");
  return text;
}

// The server's last word on its pinned memory: reads what it said until it has been quiet for
// a while. -1 if it never said.
int64_t ServerPinnedKb(RemotePeer& server, int64_t last) {
  for (std::string line; !(line = server.ReadLine(absl::Milliseconds(500))).empty();) {
    int64_t kb = 0;
    if (line.rfind("pinned ", 0) == 0 && absl::SimpleAtoi(line.substr(7), &kb)) last = kb;
  }
  return last;
}

bool Within5Percent(int64_t value, int64_t reference) {
  return value >= 0 && reference > 0 && value <= reference * 105 / 100 &&
         value >= reference * 95 / 100;
}

TEST_CASE("mixed traffic at 0, 0.1 %, 1 % and 5 % of frames lost: no call fails, nothing leaks") {
  ZRPC_REQUIRE_TWO_HOSTS(config);
  struct CleanLink {
    const zrpc::testing::TwoHosts& hosts;
    ~CleanLink() { (void)Link(hosts, "faults both none"); }
  } clean{config_hosts};
  REQUIRE(Link(config_hosts, "faults both none").ok());
  RemotePeer server(config_hosts, {Runfile("tests/rpc/rpc_peer"), "mixed", "0"});
  const std::string listening = server.ReadLine(absl::Seconds(60));
  INFO("rpc_peer in guest b said: \"" << listening << "\"");
  int port = 0;
  REQUIRE(std::sscanf(listening.c_str(), "listening %d", &port) == 1);
  zrpc::ChannelOptions options;
  options.device = config;
  auto created = zrpc::CreateChannel(absl::StrCat(config_hosts.peer_addr, ":", port), options);
  INFO(created.status());
  REQUIRE(created.ok());
  std::unique_ptr<zrpc::ClientChannel> channel = *std::move(created);
  REQUIRE(channel->Connect(absl::Now() + absl::Seconds(30)).ok());

  const absl::Duration level_time = LevelTime();
  int64_t server_pinned = -1;
  int64_t client_reference = -1, server_reference = -1;
  std::map<std::string, int64_t> objects_reference;
  uint64_t staging_reference = 0;
  double lossless_goodput = 0;
  for (const char* loss : {"0", "0.001", "0.01", "0.05"}) {
    INFO("loss " << loss);
    REQUIRE(Link(config_hosts, absl::StrCat("faults both seed=36 loss=", loss)).ok());
    const auto before = Link(config_hosts, "stats");
    REQUIRE(before.ok());
    Tally tally;
    const absl::Time start = absl::Now();
    RunTraffic(channel.get(), start + level_time, tally);
    const absl::Duration took = absl::Now() - start;
    const auto after = Link(config_hosts, "stats");
    REQUIRE(after.ok());
    REQUIRE(Link(config_hosts, "faults both none").ok());
    const int64_t lost = LinkCount(*after, "a>b", "lost") - LinkCount(*before, "a>b", "lost") +
                         LinkCount(*after, "b>a", "lost") - LinkCount(*before, "b>a", "lost");
    const double goodput = tally.bulk_bytes.load() / absl::ToDoubleSeconds(took) / 1e6;
    // Once the traffic stopped: what each side holds.
    absl::SleepFor(absl::Seconds(1));
    server_pinned = ServerPinnedKb(server, server_pinned);
    const int64_t client_pinned = zrpc::testing::PinnedKb();
    std::map<std::string, int64_t> objects = VerbsObjects();
    const uint64_t staging = channel->stats().staging_bytes_registered;
    std::printf(
        "loss %s: %llu operations in %s, %llu failed, %lld frames lost; goodput %.2f MB/s; "
        "pinned: here %lld KiB, server %lld KiB; verbs objects here: %s(staging %llu KiB)\n",
        loss, static_cast<unsigned long long>(tally.operations.load()),
        absl::FormatDuration(took).c_str(), static_cast<unsigned long long>(tally.failed.load()),
        static_cast<long long>(lost), goodput, static_cast<long long>(client_pinned),
        static_cast<long long>(server_pinned), Describe(objects).c_str(),
        static_cast<unsigned long long>(staging >> 10));
    {
      absl::MutexLock lock(&tally.mu);
      INFO("the first failure: " << tally.first_failure);
      CHECK(tally.failed.load() == 0);
    }
    CHECK(tally.operations.load() > 0);
    CHECK(channel->stats().connections_lost == 0);
    if (std::string(loss) == "0") {
      lossless_goodput = goodput;
      client_reference = client_pinned;
      server_reference = server_pinned;
      objects_reference = objects;
      staging_reference = staging;
      CHECK(lost == 0);
      continue;
    }
    CHECK(lost > 0);  // the faults happened
    // Staging buffers the channel's pool kept since (counted, bounded) are not a leak.
    REQUIRE(staging >=
            staging_reference);  // the pool keeps what it registered (far from its bound)
    const int64_t staging_kb = static_cast<int64_t>((staging - staging_reference) >> 10);
    INFO("pinned here " << client_pinned << " KiB, " << staging_kb
                        << " KiB of it new staging; after the lossless run " << client_reference);
    CHECK(Within5Percent(client_pinned - staging_kb, client_reference));
    INFO("pinned by the server " << server_pinned << " KiB, after the lossless run "
                                 << server_reference);
    CHECK(Within5Percent(server_pinned, server_reference));
    INFO("verbs objects here " << Describe(objects) << "; after the lossless run "
                               << Describe(objects_reference) << "; staging " << staging
                               << " bytes, then " << staging_reference);
    // Each staging buffer is one region of at least 4 KiB.
    const int64_t staging_regions =
        static_cast<int64_t>((staging - staging_reference) / kSmallestStagingBuffer);
    CHECK(objects["mr"] >= objects_reference["mr"]);
    CHECK(objects["mr"] <= objects_reference["mr"] + staging_regions);
    objects["mr"] = objects_reference["mr"];
    CHECK(objects == objects_reference);
    if (std::string(loss) == "0.01") {
      std::printf("goodput at 1 %% loss: %.2f of the lossless figure (target: at least 0.5)\n",
                  goodput / lossless_goodput);
      CHECK(goodput >= 0.5 * lossless_goodput);
    }
  }
}

}  // namespace
