// object_store_client: stores an object in an object_store_server and reads it back
// (proto/examples/object_store.proto): bulk payloads both ways.
//
//   object_store_client --connect ADDR:PORT [--size BYTES] [--arena BYTES] [--name KEY]
//
// Puts a pattern-filled payload, Stats it, Gets it back and compares it byte for byte, has the
// server Transform it (reverse it) and checks the result, printing sizes and timings, then
// "ok" (exit 0); on the first error or mismatch, says what went wrong (exit 1). See
// examples/README.md.
#include <cstdio>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "examples/cli.h"
#include "examples/crc32c.h"
#include "proto/examples/object_store.zrpc.h"
#include "rpc/channel.h"

namespace {

using zrpc::examples::Crc32c;
using zrpc::examples::ObjectInfo;
using zrpc::examples::ObjectKey;
using zrpc::examples::ObjectStore;
using zrpc::examples::PutReply;

constexpr char kUsage[] =
    "usage: object_store_client --connect ADDR:PORT [--size BYTES] [--arena BYTES] [--name KEY]\n"
    "  --connect ADDR:PORT  the server (what object_store_server printed after \"listening on\")\n"
    "  --size BYTES         the object's size, up to 1G, with an optional K, M or G suffix\n"
    "                       (default 1M); the server refuses one larger than its --max-bulk\n"
    "  --arena BYTES        this client's receive arena: answers' payloads up to it are written\n"
    "                       there, larger ones pulled; a multiple of 64 up to 1G (default 4M)\n"
    "  --name KEY           the object's name (default \"example\")\n";

// Generous for a large payload on an emulated device (Soft-RoCE moves tens of MiB/s).
constexpr absl::Duration kDeadline = absl::Seconds(30);

// Deterministic bytes that differ from position to position, so a misplaced, truncated or
// unreversed payload never matches by accident.
std::string Pattern(size_t size) {
  std::string bytes(size, '\0');
  uint64_t x = 0x9E3779B97F4A7C15ull;
  for (char& c : bytes) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    c = static_cast<char>(x >> 56);
  }
  return bytes;
}

// "1048576 B in 12.345 ms (81.0 MiB/s)"
std::string Timing(size_t bytes, absl::Duration took) {
  const double mib_per_s = bytes / absl::ToDoubleSeconds(took) / (1 << 20);
  return absl::StrFormat("%u B in %.3f ms (%.1f MiB/s)", bytes, absl::ToDoubleMilliseconds(took),
                         mib_per_s);
}

// Where `got` first differs from `want`, for the failure message.
std::string Mismatch(absl::string_view got, absl::string_view want) {
  if (got.size() != want.size())
    return absl::StrFormat("%u B instead of %u", got.size(), want.size());
  size_t i = 0;
  while (i < got.size() && got[i] == want[i]) ++i;
  return absl::StrFormat("byte %u differs", i);
}

int Fail(const std::string& what) {
  std::fprintf(stderr, "object_store_client: %s\n", what.c_str());
  return 1;
}

// Put, Stat, Get, Transform; 0 when everything came back as sent.
int Run(ObjectStore::Stub& stub, const std::string& name, const std::string& object) {
  ObjectKey key;
  key.set_name(name);
  const uint32_t crc = Crc32c(object);

  // The payload goes by RDMA WRITE straight from `object`, which must stay unchanged until the
  // call returns.
  PutReply put;
  absl::Time start = absl::Now();
  absl::Status s = stub.Put(key, zrpc::OutgoingBulk(object.data(), object.size()), &put,
                            zrpc::CallOptions::Timeout(kDeadline));
  if (!s.ok()) return Fail("put: " + s.ToString());
  if (put.stored_bytes() != object.size()) return Fail("put: the server stored a different size");
  std::printf("put        %s\n", Timing(object.size(), absl::Now() - start).c_str());

  ObjectInfo info;
  start = absl::Now();
  s = stub.Stat(key, &info, zrpc::CallOptions::Timeout(kDeadline));
  if (!s.ok()) return Fail("stat: " + s.ToString());
  if (info.size() != object.size() || info.crc32c() != crc) {
    return Fail(absl::StrFormat("stat: %u B with CRC-32C %08x, sent %u B with %08x", info.size(),
                                info.crc32c(), object.size(), crc));
  }
  std::printf("%s", absl::StrFormat("stat       %u B, CRC-32C %08x, in %.3f ms\n", info.size(),
                                    info.crc32c(), absl::ToDoubleMilliseconds(absl::Now() - start))
                        .c_str());

  // The response payload is read in place, in the channel's receive memory: release it (Reset
  // or destroy) promptly, the connection's later payloads wait for that memory.
  zrpc::IncomingBulk got;
  start = absl::Now();
  s = stub.Get(key, &info, &got, zrpc::CallOptions::Timeout(kDeadline));
  if (!s.ok()) return Fail("get: " + s.ToString());
  const absl::Duration get_took = absl::Now() - start;
  if (got.view() != object)
    return Fail("get: the object came back changed: " + Mismatch(got.view(), object));
  got.Reset();
  std::printf("get        %s, byte for byte as sent\n", Timing(object.size(), get_took).c_str());

  const std::string reversed(object.rbegin(), object.rend());
  zrpc::IncomingBulk transformed;
  start = absl::Now();
  s = stub.Transform(key, zrpc::OutgoingBulk(object.data(), object.size()), &info, &transformed,
                     zrpc::CallOptions::Timeout(kDeadline));
  if (!s.ok()) return Fail("transform: " + s.ToString());
  const absl::Duration transform_took = absl::Now() - start;
  if (transformed.view() != reversed) {
    return Fail("transform: not the payload reversed: " + Mismatch(transformed.view(), reversed));
  }
  if (info.size() != reversed.size() || info.crc32c() != Crc32c(reversed)) {
    return Fail("transform: the size or CRC-32C the server reported is wrong");
  }
  transformed.Reset();
  std::printf("transform  %s both ways, reversed as expected\n",
              Timing(object.size(), transform_took).c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  namespace cli = zrpc::examples::cli;
  cli::CommandLine args("object_store_client", kUsage);
  if (!args.Parse(argc, argv, {"connect", "size", "arena", "name"})) return args.exit_code();
  const std::string* target = args.Find("connect");
  if (target == nullptr) return args.UsageError("--connect is required");
  if (!cli::IsTarget(*target)) return args.UsageError("bad --connect " + *target);
  uint64_t size = 1 << 20;
  if (const std::string* text = args.Find("size")) {
    std::optional<uint64_t> n = cli::ParseBytes(*text, 0, uint64_t{1} << 30);
    if (!n) return args.UsageError("bad --size " + *text);
    size = *n;
  }
  zrpc::ChannelOptions options;
  // The Get and Transform responses' payloads up to this arena land in it; larger ones are pulled.
  options.connection.arena_size = 4 << 20;
  if (const std::string* text = args.Find("arena")) {
    std::optional<uint64_t> arena = cli::ParseBytes(*text, 64, uint64_t{1} << 30);
    if (!arena || *arena % 64 != 0) return args.UsageError("bad --arena " + *text);
    options.connection.arena_size = static_cast<uint32_t>(*arena);
  }
  const std::string* name = args.Find("name");

  // The device comes from ZRPC_RDMA_* (or is the first active one).
  absl::StatusOr<std::unique_ptr<zrpc::ClientChannel>> channel =
      zrpc::CreateChannel(*target, options);
  if (!channel.ok()) return Fail(channel.status().ToString());
  // Connecting now keeps the connection setup out of the first call's timing.
  const absl::Time start = absl::Now();
  if (absl::Status s = (*channel)->Connect(start + kDeadline); !s.ok()) {
    return Fail("connect: " + s.ToString());
  }
  std::printf("connected  in %.3f ms\n", absl::ToDoubleMilliseconds(absl::Now() - start));
  ObjectStore::Stub stub(channel->get());
  if (int failed = Run(stub, name != nullptr ? *name : "example", Pattern(size))) return failed;
  std::printf("ok\n");
  return 0;
}
