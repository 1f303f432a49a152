#include "rpc/metrics_http.h"

#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "rpc/host_port.h"
#include "rpc/monotonic.h"

namespace zrpc {
namespace {

// Waits until `fd` is ready for `events` or `until` passes; false on timeout or error.
bool WaitFor(int fd, short events, absl::Time until) {
  for (;;) {
    const absl::Duration left = until - internal::MonotonicNow();
    if (left <= absl::ZeroDuration()) return false;
    pollfd p{fd, events, 0};
    const int ms = static_cast<int>(absl::ToInt64Milliseconds(left)) + 1;
    const int n = poll(&p, 1, ms);
    if (n > 0) return (p.revents & (events | POLLHUP | POLLERR)) != 0;
    if (n < 0 && errno != EINTR) return false;
  }
}

bool WriteAll(int fd, absl::string_view data, absl::Time until) {
  while (!data.empty()) {
    const ssize_t n = send(fd, data.data(), data.size(), MSG_NOSIGNAL);
    if (n > 0) {
      data.remove_prefix(static_cast<size_t>(n));
    } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      if (!WaitFor(fd, POLLOUT, until)) return false;
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else {
      return false;
    }
  }
  return true;
}

std::string Response(absl::string_view status, absl::string_view content_type,
                     absl::string_view extra_headers, const std::string& body, bool with_body) {
  return absl::StrCat("HTTP/1.1 ", status, "\r\nContent-Type: ", content_type,
                      "\r\nContent-Length: ", body.size(), "\r\n", extra_headers,
                      "Connection: close\r\n\r\n", with_body ? body : std::string());
}

}  // namespace

absl::StatusOr<std::unique_ptr<MetricsHttpServer>> MetricsHttpServer::Start(
    absl::string_view address, Render render, absl::Duration io_timeout) {
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
    return absl::UnavailableError(absl::StrCat("metrics address \"", address,
                                               "\": cannot resolve: ", gai_strerror(rc)));
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
      new MetricsHttpServer(fd, wake, bound_port, std::move(render), io_timeout));
  server->thread_ = std::thread([s = server.get()] { s->Loop(); });
  return server;
}

MetricsHttpServer::MetricsHttpServer(int listen_fd, int wake_fd, uint16_t port, Render render,
                                     absl::Duration io_timeout)
    : listen_fd_(listen_fd), wake_fd_(wake_fd), port_(port), render_(std::move(render)),
      io_timeout_(io_timeout) {}

MetricsHttpServer::~MetricsHttpServer() {
  const uint64_t one = 1;
  static_cast<void>(write(wake_fd_, &one, sizeof one));
  if (thread_.joinable()) thread_.join();
  close(listen_fd_);
  close(wake_fd_);
}

void MetricsHttpServer::Loop() {
  for (;;) {
    pollfd fds[2] = {{listen_fd_, POLLIN, 0}, {wake_fd_, POLLIN, 0}};
    if (poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      return;
    }
    if (fds[1].revents != 0) return;
    const int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) continue;  // the peer went away first, or out of descriptors for now
    Serve(fd);
    close(fd);
  }
}

void MetricsHttpServer::Serve(int fd) {
  // The request head, up to the blank line; a body (there should be none) is not read.
  std::string head;
  const absl::Time until = internal::MonotonicNow() + io_timeout_;
  size_t end = std::string::npos;
  while ((end = head.find("\r\n\r\n")) == std::string::npos) {
    if (head.size() > kMaxRequestHead) break;
    char buf[2048];
    const ssize_t n = recv(fd, buf, sizeof buf, 0);
    if (n > 0) {
      head.append(buf, static_cast<size_t>(n));
    } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
      if (!WaitFor(fd, POLLIN, until)) return;  // silent for io_timeout: dropped
    } else {
      return;  // closed or failed before a whole head
    }
  }
  const std::string text = "text/plain; charset=utf-8";
  if (end == std::string::npos || end > kMaxRequestHead) {
    refused_.fetch_add(1, std::memory_order_relaxed);
    WriteAll(fd, Response("400 Bad Request", text, "", "request head over 8 KiB\n", true), until);
    return;
  }
  const std::string line = head.substr(0, head.find("\r\n"));
  std::vector<std::string> parts = absl::StrSplit(line, ' ');
  if (parts.size() != 3 || !absl::StartsWith(parts[2], "HTTP/1.") || parts[1].empty() ||
      parts[1][0] != '/') {
    refused_.fetch_add(1, std::memory_order_relaxed);
    WriteAll(fd, Response("400 Bad Request", text, "", "not an HTTP/1.x request line\n", true),
             until);
    return;
  }
  const std::string& method = parts[0];
  const std::string path = parts[1].substr(0, parts[1].find('?'));
  const bool head_only = method == "HEAD";
  if (method != "GET" && !head_only) {
    refused_.fetch_add(1, std::memory_order_relaxed);
    WriteAll(fd, Response("405 Method Not Allowed", text, "Allow: GET, HEAD\r\n",
                          "only GET and HEAD\n", true),
             until);
    return;
  }
  if (path != "/metrics") {
    refused_.fetch_add(1, std::memory_order_relaxed);
    WriteAll(fd, Response("404 Not Found", text, "", "the metrics are at /metrics\n", !head_only),
             until);
    return;
  }
  scrapes_.fetch_add(1, std::memory_order_relaxed);
  WriteAll(fd,
           Response("200 OK", "text/plain; version=0.0.4; charset=utf-8", "", render_(),
                    !head_only),
           internal::MonotonicNow() + io_timeout_);
}

}  // namespace zrpc
