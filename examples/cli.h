// What the example programs share that is not about zrpc: their command lines and signals. The
// benchmark programs use its host:port parsing too.
//
// The examples take "--name VALUE" (or "--name=VALUE") options and nothing else, parsed here
// without a flags library so a copy needs only what zrpc itself links. A bad command line ends
// the program with exit code 2 and a message followed by the usage, never with a crash.
// Tokenize is the one parser under it, which the benchmark programs and bench_report use too
// (with switches and positional words).
#ifndef ZRPC_EXAMPLES_CLI_H_
#define ZRPC_EXAMPLES_CLI_H_

#include <csignal>
#include <cstdint>
#include <initializer_list>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace zrpc::examples::cli {

// One word of a command line, as Tokenize splits it.
struct Word {
  std::string name;        // an option's or a switch's name, without "--"; empty: positional
  std::string value;       // the option's value, or the positional word
  bool is_switch = false;  // a switch: given, no value
};

// What a program accepts.
struct Options {
  std::vector<absl::string_view> with_value;  // "--name VALUE" or "--name=VALUE"
  std::vector<absl::string_view> switches;    // "--name"
  bool positional = false;  // words that are not options (and all words after "--") are kept
};

// Splits `args` (argv without the program name) into words. "--help" or "-h" sets *help and
// returns the words so far. kInvalidArgument naming the word: "unknown option --x", "--x needs
// a value", "--x takes no value", "unexpected argument 'x'" (when positional words are not
// accepted).
absl::StatusOr<std::vector<Word>> Tokenize(const std::vector<std::string>& args,
                                           const Options& options, bool* help);

// One program's command line: "--name VALUE" / "--name=VALUE" options and "--help".
//
//   cli::CommandLine args("greeter_client", kUsage);
//   if (!args.Parse(argc, argv, {"connect", "calls"})) return args.exit_code();
//   if (const std::string* calls = args.Find("calls")) ...
//     return args.UsageError("bad --calls " + *calls);   // prints it, with the usage; returns 2
class CommandLine {
 public:
  // `program` prefixes messages; `usage` (one or more lines, each ending in a newline) is printed
  // with every error, and alone for --help. Both must outlive this.
  CommandLine(const char* program, const char* usage) : program_(program), usage_(usage) {}

  // Parses argv[1..argc) as options named in `known`. False when main should end now, returning
  // exit_code(): 0 after printing the usage for --help or -h, 2 after printing an error for an
  // unknown option, a missing value, an option given twice or a word that is not an option.
  bool Parse(int argc, char** argv, std::initializer_list<absl::string_view> known);
  int exit_code() const { return exit_code_; }

  // The value of option `name`, or null when it was not given.
  const std::string* Find(absl::string_view name) const;

  // Prints "PROGRAM: MESSAGE" and the usage to stderr; returns 2, the exit code for a bad
  // command line.
  int UsageError(absl::string_view message) const;

 private:
  const char* program_;
  const char* usage_;
  std::map<std::string, std::string, std::less<>> values_;
  int exit_code_ = 0;
};

// A listening or connecting address: "198.18.0.1:7471", "[fe80::1]:7471", or ":7471" (no
// address: the caller decides what that means).
struct HostPort {
  std::string address;  // without brackets
  uint16_t port = 0;
};
std::optional<HostPort> ParseHostPort(absl::string_view text);
// True for a host:port a client can connect to: an address and a port other than 0.
bool IsTarget(absl::string_view text);
// The inverse of ParseHostPort: brackets around an IPv6 address.
std::string FormatHostPort(absl::string_view address, uint16_t port);

// A whole number in [min, max].
std::optional<uint64_t> ParseNumber(absl::string_view text, uint64_t min, uint64_t max);
// A byte count in [min, max]: "4096", or with a binary suffix "64K", "1M", "1G".
std::optional<uint64_t> ParseBytes(absl::string_view text, uint64_t min, uint64_t max);

// Blocks SIGINT and SIGTERM in the calling thread. Call it first in main, before any thread
// starts: threads inherit the mask, so the signals wait for WaitForStopSignal instead of
// killing the process or interrupting another thread.
sigset_t BlockStopSignals();
// Waits for one of the signals BlockStopSignals blocked; returns its number.
int WaitForStopSignal(const sigset_t& signals);

}  // namespace zrpc::examples::cli

#endif  // ZRPC_EXAMPLES_CLI_H_
