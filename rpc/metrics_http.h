// MetricsHttpServer: /metrics (and a server's /healthz and /readyz) over HTTP, for Prometheus and
// load balancers.
//
//   ServerOptions options;
//   options.metrics_address = "0.0.0.0:9464";   // the Server runs one of these for its metrics
//
// or, for a client program (or anything else that renders Prometheus text):
//
//   auto http = zrpc::MetricsHttpServer::Start("127.0.0.1:9464",
//                                              [&] { return channel->metrics().PrometheusText();
//                                              });
//
// What it is. A deliberately small HTTP/1.1 server on a plain TCP socket (not the RDMA device):
// one thread polling up to 16 connections at once, one request per connection
// (`Connection: close`), answering
//   GET /metrics, HEAD /metrics  200, text/plain; version=0.0.4 (Prometheus' text format),
//                                the body `render()` returns, rendered afresh for each scrape;
//   a path of `pages`            the Page its function returns (a Server's: /healthz,
//                                /readyz, /connections), asked afresh each time;
//   any other path               404;
//   any other method             405 (Allow: GET, HEAD);
//   a request it cannot parse    400.
// A query string is ignored ("/metrics?x=1" is /metrics).
//
// Bounds, because whoever can reach the port is a peer: a request head (request line and
// headers) larger than 8 KiB gets 400 (431 in spirit); a client must send its whole head within
// `io_timeout` (2 s) of connecting, and is dropped when its answer makes no progress for
// io_timeout (a slow reader that keeps reading gets all of it). After the answer, what the
// client still sends is read and discarded (64 KiB, 0.5 s at most) so that closing does not
// reset the connection under an unread answer. At most 16 connections are served at once; more
// wait in the listen backlog, so slow clients delay a scrape by at most io_timeout. Out of
// descriptors, accepting pauses for 100 ms instead of spinning. Nothing it receives reaches the
// RPC runtime. It does not speak TLS or authenticate: bind it to an address only your
// monitoring reaches.
//
// Threads: `render` runs on the endpoint's thread, one call at a time; it must be thread-safe
// with respect to the rest of the program (Metrics::PrometheusText and Server::stats are). The
// destructor stops the thread (at once, between two polls: only a render in progress delays
// it) and closes the socket and every connection.
#ifndef ZRPC_RPC_METRICS_HTTP_H_
#define ZRPC_RPC_METRICS_HTTP_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace zrpc {

class MetricsHttpServer {
 public:
  using Render = std::function<std::string()>;
  // A page beside /metrics: its status ("200 OK", "503 Service Unavailable"), body, and the
  // body's type (empty: plain text).
  struct Page {
    std::string status;
    std::string body;
    std::string content_type = std::string();
  };
  // Pages by exact path ("/healthz"), each function run on the endpoint's thread per request.
  using Pages = std::map<std::string, std::function<Page()>>;

  static constexpr size_t kMaxRequestHead = 8 * 1024;

  // Listens on `address`, "host:port" ("[v6]:port"; port 0: any free one, port() says which;
  // host 0.0.0.0 or [::]: every interface), and serves from a thread of its own.
  // kInvalidArgument for a malformed address or an io_timeout outside (0, 1 h]; kUnavailable
  // when it cannot bind (in use, not an address of this host), naming the address and why.
  // `pages`: served besides /metrics.
  static absl::StatusOr<std::unique_ptr<MetricsHttpServer>> Start(
      absl::string_view address, Render render, absl::Duration io_timeout = absl::Seconds(2),
      Pages pages = {});
  ~MetricsHttpServer();
  MetricsHttpServer(const MetricsHttpServer&) = delete;
  MetricsHttpServer& operator=(const MetricsHttpServer&) = delete;

  uint16_t port() const { return port_; }
  // How many requests it answered from /metrics or a page (whatever the page's status) / refused
  // with an error status of its own (400, 404, 405).
  uint64_t scrapes() const { return scrapes_.load(std::memory_order_relaxed); }
  uint64_t refused() const { return refused_.load(std::memory_order_relaxed); }

 private:
  struct Client;

  MetricsHttpServer(int listen_fd, int wake_fd, uint16_t port, Render render,
                    absl::Duration io_timeout, Pages pages);
  void Loop();
  // Moves `client` on as far as its socket allows; closes it (fd -1) when done or failed.
  void Advance(Client& client, absl::Time now);
  // The whole response to a request head.
  std::string Answer(const std::string& head);

  const int listen_fd_;
  const int wake_fd_;  // an eventfd: written by the destructor to stop Loop
  const uint16_t port_;
  const Render render_;
  const absl::Duration io_timeout_;
  const Pages pages_;
  std::atomic<uint64_t> scrapes_{0};
  std::atomic<uint64_t> refused_{0};
  std::thread thread_;
};

}  // namespace zrpc

#endif  // ZRPC_RPC_METRICS_HTTP_H_
