// MetricsHttpServer (rpc/metrics_http.h): a bounded HTTP/1.1 server for /metrics.

#include "rpc/metrics_http.h"

#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstring>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "rpc/common/host_port.h"
#include "rpc/common/monotonic.h"

namespace zrpc {
namespace {

constexpr size_t kMaxConnections = 16;
constexpr size_t kMaxDrain = 64 * 1024;  // bytes read and discarded after an answer

// A poll(2) timeout for `until`: 0 when past, -1 for none, never an int overflow.
int PollTimeoutMs(absl::Time until, absl::Time now) {
  if (until == absl::InfiniteFuture()) return -1;
  if (until <= now) return 0;
  const int64_t ms = absl::ToInt64Milliseconds(until - now) + 1;
  return ms > INT_MAX ? INT_MAX : static_cast<int>(ms);
}

std::string Response(absl::string_view status, absl::string_view content_type,
                     absl::string_view extra_headers, const std::string& body, bool with_body) {
  return absl::StrCat("HTTP/1.1 ", status, "\r\nContent-Type: ", content_type,
                      "\r\nContent-Length: ", body.size(), "\r\n", extra_headers,
                      "Connection: close\r\n\r\n", with_body ? body : std::string());
}

}  // namespace

absl::StatusOr<std::unique_ptr<MetricsHttpServer>> MetricsHttpServer::Start(
    absl::string_view address, Render render, absl::Duration io_timeout, Pages pages) {
  if (io_timeout <= absl::ZeroDuration() || io_timeout > absl::Hours(1)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "metrics endpoint: io_timeout ", absl::FormatDuration(io_timeout), " is not in (0, 1h]"));
  }
  std::string host;
  uint16_t port = 0;
  if (absl::Status s = internal::ParseHostPort(address, "metrics address", true, &host, &port);
      !s.ok()) {
    return s;
  }
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const std::string service = std::to_string(port);
  if (int rc = getaddrinfo(host.c_str(), service.c_str(), &hints, &found); rc != 0) {
    return absl::UnavailableError(
        absl::StrCat("metrics address \"", address, "\": cannot resolve: ", gai_strerror(rc)));
  }
  int fd = -1;
  std::string why = "no address";
  for (addrinfo* a = found; a != nullptr && fd < 0; a = a->ai_next) {
    fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol);
    if (fd < 0) {
      why = std::strerror(errno);
      continue;
    }
    const int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(fd, a->ai_addr, a->ai_addrlen) != 0 || listen(fd, 16) != 0) {
      why = std::strerror(errno);
      close(fd);
      fd = -1;
    }
  }
  freeaddrinfo(found);
  if (fd < 0) {
    return absl::UnavailableError(
        absl::StrCat("metrics address \"", address, "\": cannot listen: ", why));
  }
  sockaddr_storage bound{};
  socklen_t len = sizeof bound;
  getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &len);
  const uint16_t bound_port =
      ntohs(bound.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                                        : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  const int wake = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (wake < 0) {
    const std::string reason = std::strerror(errno);
    close(fd);
    return absl::UnavailableError(absl::StrCat("metrics endpoint: eventfd: ", reason));
  }
  std::unique_ptr<MetricsHttpServer> server(
      new MetricsHttpServer(fd, wake, bound_port, std::move(render), io_timeout, std::move(pages)));
  server->thread_ = std::thread([s = server.get()] { s->Loop(); });
  return server;
}

MetricsHttpServer::MetricsHttpServer(int listen_fd, int wake_fd, uint16_t port, Render render,
                                     absl::Duration io_timeout, Pages pages)
    : listen_fd_(listen_fd),
      wake_fd_(wake_fd),
      port_(port),
      render_(std::move(render)),
      io_timeout_(io_timeout),
      pages_(std::move(pages)) {}

MetricsHttpServer::~MetricsHttpServer() {
  const uint64_t one = 1;
  // An eventfd write fails only when the counter would overflow: a wake-up is pending anyway.
  const ssize_t written = write(wake_fd_, &one, sizeof one);
  static_cast<void>(written);
  if (thread_.joinable()) thread_.join();
  close(listen_fd_);
  close(wake_fd_);
}

// One connection of the loop: reading its request head, writing the answer, or draining what
// it still sends (closing with unread input would reset the connection and lose the answer).
struct MetricsHttpServer::Client {
  enum class State { kReading, kWriting, kDraining };
  int fd;
  State state = State::kReading;
  std::string in;
  std::string out;
  size_t sent = 0;
  size_t drained = 0;
  absl::Time deadline;
};

void MetricsHttpServer::Loop() {
  std::vector<Client> clients;
  absl::Time accept_paused_until = absl::InfinitePast();
  std::vector<pollfd> fds;
  for (;;) {
    absl::Time now = internal::MonotonicNow();
    const bool paused = now < accept_paused_until;
    const bool accepting = clients.size() < kMaxConnections && !paused;
    fds.clear();
    fds.push_back({wake_fd_, POLLIN, 0});
    fds.push_back({listen_fd_, static_cast<short>(accepting ? POLLIN : 0), 0});
    absl::Time next = paused ? accept_paused_until : absl::InfiniteFuture();
    for (const Client& c : clients) {
      fds.push_back(
          {c.fd, static_cast<short>(c.state == Client::State::kWriting ? POLLOUT : POLLIN), 0});
      next = std::min(next, c.deadline);
    }
    const int n = poll(fds.data(), fds.size(), PollTimeoutMs(next, now));
    if (n < 0 && errno != EINTR) break;
    if (fds[0].revents != 0) break;  // the destructor: stop
    now = internal::MonotonicNow();
    // Existing clients first (fds[2 + i] is clients[i]); accepting appends to the vector.
    for (size_t i = 0; i < clients.size(); ++i) {
      if (n > 0 && fds[2 + i].revents != 0) Advance(clients[i], now);
    }
    size_t kept = 0;
    for (size_t i = 0; i < clients.size(); ++i) {
      Client& c = clients[i];
      if (c.fd >= 0 && now >= c.deadline) {  // silent, or not reading what it asked for
        close(c.fd);
        c.fd = -1;
      }
      if (c.fd < 0) continue;
      if (kept != i) clients[kept] = std::move(c);
      ++kept;
    }
    clients.resize(kept);
    if (n > 0 && (fds[1].revents & POLLIN) != 0) {
      while (clients.size() < kMaxConnections) {
        const int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
        if (fd >= 0) {
          Client c;
          c.fd = fd;
          c.deadline = now + io_timeout_;  // the whole request head within io_timeout
          clients.push_back(std::move(c));
          continue;
        }
        if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
          // Out of descriptors or memory: the listener stays readable, so pause instead of
          // spinning; the connection waits in the backlog.
          accept_paused_until = now + absl::Milliseconds(100);
        }
        break;  // EAGAIN (none left), or a peer gone before accept: nothing to do
      }
    }
  }
  for (Client& c : clients) close(c.fd);
}

void MetricsHttpServer::Advance(Client& c, absl::Time now) {
  char buf[4096];
  switch (c.state) {
    case Client::State::kReading: {
      for (;;) {
        const ssize_t n = recv(c.fd, buf, sizeof buf, 0);
        if (n > 0) {
          c.in.append(buf, static_cast<size_t>(n));
          if (c.in.find("\r\n\r\n") != std::string::npos || c.in.size() > kMaxRequestHead) break;
          continue;
        }
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return;
        close(c.fd);  // closed or failed before a whole head
        c.fd = -1;
        return;
      }
      c.out = Answer(c.in);
      c.in.clear();
      c.in.shrink_to_fit();
      c.state = Client::State::kWriting;
      c.deadline = now + io_timeout_;
      [[fallthrough]];
    }
    case Client::State::kWriting: {
      while (c.sent < c.out.size()) {
        const ssize_t n = send(c.fd, c.out.data() + c.sent, c.out.size() - c.sent, MSG_NOSIGNAL);
        if (n > 0) {
          c.sent += static_cast<size_t>(n);
          c.deadline = now + io_timeout_;  // a slow reader is fine while it reads
          continue;
        }
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return;
        close(c.fd);
        c.fd = -1;
        return;
      }
      // All sent: say so, then read what the client still sends until it closes, so that the
      // close does not reset the connection under an answer it has not read yet.
      shutdown(c.fd, SHUT_WR);
      c.out.clear();
      c.out.shrink_to_fit();
      c.state = Client::State::kDraining;
      c.deadline = now + std::min(io_timeout_, absl::Milliseconds(500));
      [[fallthrough]];
    }
    case Client::State::kDraining: {
      for (;;) {
        const ssize_t n = recv(c.fd, buf, sizeof buf, 0);
        if (n > 0 && (c.drained += static_cast<size_t>(n)) <= kMaxDrain) continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return;
        close(c.fd);  // the client closed, failed, or sends too much
        c.fd = -1;
        return;
      }
    }
  }
}

std::string MetricsHttpServer::Answer(const std::string& head) {
  const std::string text = "text/plain; charset=utf-8";
  const size_t end = head.find("\r\n\r\n");
  if (end == std::string::npos || end > kMaxRequestHead) {
    refused_.fetch_add(1, std::memory_order_relaxed);
    return Response("400 Bad Request", text, "", "request head over 8 KiB\n", true);
  }
  const std::string line = head.substr(0, head.find("\r\n"));
  std::vector<std::string> parts = absl::StrSplit(line, ' ');
  if (parts.size() != 3 || !absl::StartsWith(parts[2], "HTTP/1.") || parts[1].empty() ||
      parts[1][0] != '/') {
    refused_.fetch_add(1, std::memory_order_relaxed);
    return Response("400 Bad Request", text, "", "not an HTTP/1.x request line\n", true);
  }
  const std::string& method = parts[0];
  const std::string path = parts[1].substr(0, parts[1].find('?'));
  const bool head_only = method == "HEAD";
  if (method != "GET" && !head_only) {
    refused_.fetch_add(1, std::memory_order_relaxed);
    return Response("405 Method Not Allowed", text, "Allow: GET, HEAD\r\n", "only GET and HEAD\n",
                    true);
  }
  if (path != "/metrics") {
    auto page = pages_.find(path);
    if (page == pages_.end()) {
      refused_.fetch_add(1, std::memory_order_relaxed);
      return Response("404 Not Found", text, "", "the metrics are at /metrics\n", !head_only);
    }
    scrapes_.fetch_add(1, std::memory_order_relaxed);
    const Page answer = page->second();
    return Response(answer.status, answer.content_type.empty() ? text : answer.content_type, "",
                    answer.body, !head_only);
  }
  scrapes_.fetch_add(1, std::memory_order_relaxed);
  return Response("200 OK", "text/plain; version=0.0.4; charset=utf-8", "", render_(), !head_only);
}

}  // namespace zrpc
