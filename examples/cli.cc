#include "examples/cli.h"

#include <algorithm>
#include <cstdio>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace zrpc::examples::cli {

absl::StatusOr<std::vector<Word>> Tokenize(const std::vector<std::string>& args,
                                           const Options& options, bool* help) {
  *help = false;
  std::vector<Word> words;
  auto among = [](const std::vector<absl::string_view>& names, absl::string_view name) {
    return std::find(names.begin(), names.end(), name) != names.end();
  };
  for (size_t i = 0; i < args.size(); ++i) {
    absl::string_view arg = args[i];
    if (arg == "--help" || arg == "-h") {
      *help = true;
      return words;
    }
    if (arg == "--" && options.positional) {
      for (++i; i < args.size(); ++i) words.push_back(Word{"", args[i], false});
      break;
    }
    if (!absl::ConsumePrefix(&arg, "--") || arg.empty()) {
      if (!options.positional) {
        return absl::InvalidArgumentError(absl::StrCat("unexpected argument '", args[i], "'"));
      }
      words.push_back(Word{"", args[i], false});
      continue;
    }
    absl::string_view name = arg;
    std::optional<absl::string_view> value;
    if (size_t eq = arg.find('='); eq != absl::string_view::npos) {
      name = arg.substr(0, eq);
      value = arg.substr(eq + 1);
    }
    if (among(options.switches, name)) {
      if (value.has_value()) {
        return absl::InvalidArgumentError(absl::StrCat("--", name, " takes no value"));
      }
      words.push_back(Word{std::string(name), "", /*is_switch=*/true});
      continue;
    }
    if (!among(options.with_value, name)) {
      return absl::InvalidArgumentError(absl::StrCat("unknown option --", name));
    }
    if (!value.has_value()) {
      if (i + 1 == args.size()) {
        return absl::InvalidArgumentError(absl::StrCat("--", name, " needs a value"));
      }
      value = args[++i];
    }
    words.push_back(Word{std::string(name), std::string(*value), false});
  }
  return words;
}

bool CommandLine::Parse(int argc, char** argv, std::initializer_list<absl::string_view> known) {
  bool help = false;
  absl::StatusOr<std::vector<Word>> words =
      Tokenize(std::vector<std::string>(argv + 1, argv + argc), Options{known, {}, false}, &help);
  if (help) {
    std::fputs(usage_, stdout);
    exit_code_ = 0;
    return false;
  }
  if (!words.ok()) {
    exit_code_ = UsageError(words.status().message());
    return false;
  }
  for (Word& word : *words) {
    if (!values_.emplace(word.name, std::move(word.value)).second) {
      exit_code_ = UsageError(absl::StrCat("--", word.name, " given twice"));
      return false;
    }
  }
  return true;
}

const std::string* CommandLine::Find(absl::string_view name) const {
  auto it = values_.find(name);
  return it == values_.end() ? nullptr : &it->second;
}

int CommandLine::UsageError(absl::string_view message) const {
  std::fprintf(stderr, "%s: %s\n%s", program_, std::string(message).c_str(), usage_);
  return 2;
}

std::optional<HostPort> ParseHostPort(absl::string_view text) {
  const size_t colon = text.rfind(':');
  if (colon == absl::string_view::npos) return std::nullopt;
  absl::string_view address = text.substr(0, colon);
  if (absl::ConsumePrefix(&address, "[") && !absl::ConsumeSuffix(&address, "]")) {
    return std::nullopt;
  }
  // An unbracketed address with a colon is IPv6 without brackets: which colon ends it?
  if (address.find_first_of(":[]") != absl::string_view::npos && text.front() != '[') {
    return std::nullopt;
  }
  std::optional<uint64_t> port = ParseNumber(text.substr(colon + 1), 0, 65535);
  if (!port.has_value()) return std::nullopt;
  return HostPort{std::string(address), static_cast<uint16_t>(*port)};
}

bool IsTarget(absl::string_view text) {
  std::optional<HostPort> target = ParseHostPort(text);
  return target.has_value() && !target->address.empty() && target->port != 0;
}

std::string FormatHostPort(absl::string_view address, uint16_t port) {
  if (address.find(':') != absl::string_view::npos) return absl::StrCat("[", address, "]:", port);
  return absl::StrCat(address, ":", port);
}

std::optional<uint64_t> ParseNumber(absl::string_view text, uint64_t min, uint64_t max) {
  uint64_t value = 0;
  // SimpleAtoi accepts surrounding spaces and a '+': a command line means digits only.
  if (text.empty() || !absl::ascii_isdigit(static_cast<unsigned char>(text.front())) ||
      !absl::ascii_isdigit(static_cast<unsigned char>(text.back())) ||
      !absl::SimpleAtoi(text, &value) || value < min || value > max) {
    return std::nullopt;
  }
  return value;
}

std::optional<uint64_t> ParseBytes(absl::string_view text, uint64_t min, uint64_t max) {
  int shift = 0;
  if (absl::ConsumeSuffix(&text, "K"))
    shift = 10;
  else if (absl::ConsumeSuffix(&text, "M"))
    shift = 20;
  else if (absl::ConsumeSuffix(&text, "G"))
    shift = 30;
  // Bound the number before shifting so it cannot overflow.
  std::optional<uint64_t> value = ParseNumber(text, 0, max >> shift);
  if (!value.has_value() || (*value << shift) < min) return std::nullopt;
  return *value << shift;
}

sigset_t BlockStopSignals() {
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  return signals;
}

int WaitForStopSignal(const sigset_t& signals) {
  int signal = 0;
  while (sigwait(&signals, &signal) != 0) {
  }
  return signal;
}

}  // namespace zrpc::examples::cli
