// numbers_client: each kind of call of zrpc.examples.Numbers (proto/examples/numbers.proto).
//
//   numbers_client --connect ADDR:PORT [--count N]
//
// Runs, each with a 30 s deadline: Count (server streaming: N numbers read as they come), Sum
// (client streaming: N numbers written, one total back), Double (bidirectional: a writer thread
// and this one reading), Square (unary). Prints one line per call and then "all calls ok"
// (exit 0), or the first error (exit 1). See examples/README.md.
#include <cstdint>
#include <cstdio>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "examples/cli.h"
#include "proto/examples/numbers.zrpc.h"
#include "rpc/channel.h"

namespace {

using zrpc::CallOptions;
using zrpc::examples::CountRequest;
using zrpc::examples::Number;
using zrpc::examples::Numbers;
using zrpc::examples::Total;

constexpr char kUsage[] =
    "usage: numbers_client --connect ADDR:PORT [--count N]\n"
    "  --connect ADDR:PORT  the server (what numbers_server printed after \"listening on\")\n"
    "  --count N            numbers per stream, 1 to 1000000 (default 1000)\n";

constexpr absl::Duration kDeadline = absl::Seconds(30);

// Server streaming: read until the server's status.
absl::Status CountTo(Numbers::Stub& stub, uint64_t count) {
  CountRequest request;
  request.set_start(1);
  request.set_count(count);
  zrpc::ClientReader<Number> reader = stub.Count(request, CallOptions::Timeout(kDeadline));
  Number number;
  uint64_t expected = 1;
  while (reader.Read(&number)) {
    if (number.value() != expected) {
      reader.Cancel();  // Finish then says CANCELLED; the mismatch is the error to report
      static_cast<void>(reader.Finish());
      return absl::DataLossError(
          absl::StrCat("Count: got ", number.value(), ", expected ", expected));
    }
    ++expected;
  }
  absl::Status status = reader.Finish();
  if (status.ok() && expected - 1 != count) {
    return absl::DataLossError(absl::StrCat("Count: ", expected - 1, " numbers of ", count));
  }
  if (status.ok()) std::printf("Count: %llu numbers in order\n", (unsigned long long)count);
  return status;
}

// Client streaming: write, close the writes, then the one answer.
absl::Status SumTo(Numbers::Stub& stub, uint64_t count) {
  Total total;
  zrpc::ClientWriter<Number> writer = stub.Sum(&total, CallOptions::Timeout(kDeadline));
  Number number;
  for (uint64_t i = 1; i <= count; ++i) {
    number.set_value(i);
    if (!writer.Write(number)) break;  // the stream ended: Finish says why
  }
  writer.WritesDone();
  absl::Status status = writer.Finish();
  if (status.ok()) {
    std::printf("Sum: %llu numbers, total %llu\n", (unsigned long long)total.count(),
                (unsigned long long)total.sum());
  }
  return status;
}

// Bidirectional: one thread writes while this one reads.
absl::Status DoubleAll(Numbers::Stub& stub, uint64_t count) {
  zrpc::ClientReaderWriter<Number, Number> stream = stub.Double(CallOptions::Timeout(kDeadline));
  std::thread writer([&stream, count] {
    Number number;
    for (uint64_t i = 1; i <= count; ++i) {
      number.set_value(i);
      if (!stream.Write(number)) break;
    }
    stream.WritesDone();
  });
  Number number;
  uint64_t read = 0;
  bool doubled = true;
  while (stream.Read(&number)) doubled = doubled && number.value() == 2 * ++read;
  writer.join();
  absl::Status status = stream.Finish();
  if (status.ok() && (!doubled || read != count)) {
    status = absl::DataLossError(absl::StrCat("Double: ", read, " of ", count, " numbers back",
                                              doubled ? "" : ", not all doubled"));
  }
  if (status.ok()) std::printf("Double: %llu numbers back doubled\n", (unsigned long long)read);
  return status;
}

}  // namespace

int main(int argc, char** argv) {
  zrpc::examples::cli::CommandLine args("numbers_client", kUsage);
  if (!args.Parse(argc, argv, {"connect", "count"})) return args.exit_code();
  const std::string* target = args.Find("connect");
  if (target == nullptr) return args.UsageError("--connect is required");
  if (!zrpc::examples::cli::IsTarget(*target)) return args.UsageError("bad --connect " + *target);
  uint64_t count = 1000;
  if (const std::string* text = args.Find("count")) {
    std::optional<uint64_t> n = zrpc::examples::cli::ParseNumber(*text, 1, 1000000);
    if (!n) return args.UsageError("bad --count " + *text);
    count = *n;
  }

  absl::StatusOr<std::unique_ptr<zrpc::ClientChannel>> channel =
      zrpc::CreateChannel(*target, zrpc::ChannelOptions{});
  if (!channel.ok()) {
    std::fprintf(stderr, "numbers_client: %s\n", channel.status().ToString().c_str());
    return 1;
  }
  Numbers::Stub stub(channel->get());
  for (auto call : {CountTo, SumTo, DoubleAll}) {
    if (absl::Status status = call(stub, count); !status.ok()) {
      std::fprintf(stderr, "numbers_client: %s\n", status.ToString().c_str());
      return 1;
    }
  }
  Number seven;
  seven.set_value(7);
  Number squared;
  if (absl::Status status = stub.Square(seven, &squared, CallOptions::Timeout(kDeadline));
      !status.ok()) {
    std::fprintf(stderr, "numbers_client: Square: %s\n", status.ToString().c_str());
    return 1;
  }
  std::printf("Square: 7 * 7 = %llu\n", (unsigned long long)squared.value());
  std::printf("all calls ok\n");
  return 0;
}
