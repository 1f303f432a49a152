// The /metrics endpoint (rpc/metrics_http.h) as Prometheus and hostile clients meet it, over
// loopback TCP: fetched by curl, checked by promtool and by the project's strict parser; wrong
// paths, methods and malformed requests; a client that never speaks; a head over the limit.
#include "rpc/metrics_http.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "rpc/metrics.h"
#include "tests/rpc/prometheus_parse.h"
#include "tests/rpc/scrape.h"
#include "tests/skip.h"

namespace {

using zrpc::Metrics;
using zrpc::MetricsHttpServer;
using zrpc::MetricsSide;

std::string Url(const MetricsHttpServer& http, const std::string& path) {
  return absl::StrCat("http://127.0.0.1:", http.port(), path);
}

// A TCP connection to the endpoint that sends `bytes` and reads until the server closes.
int Connect(uint16_t port) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
  return fd;
}

std::string Exchange(uint16_t port, const std::string& bytes) {
  const int fd = Connect(port);
  size_t sent = 0;
  while (sent < bytes.size()) {
    const ssize_t n = send(fd, bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) break;
    sent += static_cast<size_t>(n);
  }
  std::string reply;
  char buf[4096];
  ssize_t n;
  while ((n = recv(fd, buf, sizeof buf, 0)) > 0) reply.append(buf, static_cast<size_t>(n));
  close(fd);
  return reply;
}

struct Served {
  explicit Served(absl::Duration io_timeout = absl::Milliseconds(300)) {
    zrpc::MethodMetrics& get = metrics.ForMethod(MetricsSide::kServer, "pkg.Store/Get");
    get.OnStart();
    get.OnFinish(absl::StatusCode::kOk, absl::Microseconds(7));
    get.OnStart();
    get.OnFinish(absl::StatusCode::kNotFound, absl::Microseconds(30));
    metrics.ForMethod(MetricsSide::kClient, "pkg.Store/Put").OnStart();
    auto started = MetricsHttpServer::Start(
        "127.0.0.1:0",
        [this] {
          renders.fetch_add(1);
          return metrics.PrometheusText();
        },
        io_timeout);
    INFO(started.status());
    REQUIRE(started.ok());
    http = *std::move(started);
  }
  Metrics metrics;
  std::atomic<int> renders{0};
  std::unique_ptr<MetricsHttpServer> http;
};

}  // namespace

TEST_CASE(
    "curl gets /metrics: 200, Prometheus' content type, the registry's text, which the "
    "strict parser takes") {
  Served s;
  REQUIRE(s.http->port() != 0);
  zrpc::testing::HttpResponse r = zrpc::testing::Curl(Url(*s.http, "/metrics"));
  INFO(r.headers);
  REQUIRE(r.curl_exit == 0);
  CHECK(r.status == 200);
  CHECK(absl::StrContains(r.headers, "Content-Type: text/plain; version=0.0.4; charset=utf-8"));
  CHECK(absl::StrContains(r.headers, absl::StrCat("Content-Length: ", r.body.size())));
  CHECK(r.body == s.metrics.PrometheusText());
  auto samples = zrpc::testing::ParsePrometheusText(r.body);
  INFO(samples.status());
  REQUIRE(samples.ok());
  CHECK(samples->at("zrpc_calls_finished_total{side=\"server\",method=\"pkg.Store/"
                    "Get\",code=\"NOT_FOUND\"}") == 1);
  // Rendered afresh for each scrape.
  s.metrics.ForMethod(MetricsSide::kServer, "pkg.Store/Get").OnStart();
  r = zrpc::testing::Curl(Url(*s.http, "/metrics?debug=1"));
  CHECK(r.status == 200);
  CHECK(absl::StrContains(
      r.body, "zrpc_calls_started_total{side=\"server\",method=\"pkg.Store/Get\"} 3\n"));
  CHECK(s.http->scrapes() == 2);
  CHECK(s.renders.load() == 2);
}

TEST_CASE("promtool check metrics accepts what /metrics serves") {
  std::optional<std::string> promtool = zrpc::testing::FindPromtool();
  if (!promtool) {
    ZRPC_SKIP(
        "no promtool: run tools/install-deps (it extracts one) and tools/test, or put "
        "promtool on PATH");
  }
  Served s;
  zrpc::testing::HttpResponse r = zrpc::testing::Curl(Url(*s.http, "/metrics"));
  REQUIRE(r.status == 200);
  zrpc::testing::CommandResult check =
      zrpc::testing::RunCommand("'" + *promtool + "' check metrics", r.body);
  INFO(check.output);
  CHECK(check.exit_code == 0);
  // And promtool is no rubber stamp: it refuses a counter without _total.
  zrpc::testing::CommandResult bad = zrpc::testing::RunCommand(
      "'" + *promtool + "' check metrics", "# HELP x y\n# TYPE x counter\nx 1\n# TYPE x gauge\n");
  CHECK(bad.exit_code != 0);
}

TEST_CASE("other paths get 404, other methods 405, HEAD the headers alone") {
  Served s;
  CHECK(zrpc::testing::Curl(Url(*s.http, "/")).status == 404);
  CHECK(zrpc::testing::Curl(Url(*s.http, "/metricsx")).status == 404);
  zrpc::testing::HttpResponse post =
      zrpc::testing::Curl(Url(*s.http, "/metrics"), "-X POST -d x=1");
  CHECK(post.status == 405);
  CHECK(absl::StrContains(post.headers, "Allow: GET, HEAD"));
  zrpc::testing::HttpResponse head = zrpc::testing::Curl(Url(*s.http, "/metrics"), "-I");
  CHECK(head.status == 200);
  // (curl -I writes the headers where the body would go; the raw reply shows there is none.)
  const std::string raw = Exchange(s.http->port(), "HEAD /metrics HTTP/1.1\r\n\r\n");
  CHECK(absl::StartsWith(raw, "HTTP/1.1 200 OK\r\n"));
  CHECK(raw.find("\r\n\r\n") == raw.size() - 4);
  CHECK(absl::StrContains(head.headers,
                          absl::StrCat("Content-Length: ", s.metrics.PrometheusText().size())));
  CHECK(s.http->refused() == 3);
}

TEST_CASE("pages beside /metrics answer with their own status and body, asked afresh") {
  std::atomic<bool> ready{true};
  MetricsHttpServer::Pages pages;
  pages["/healthz"] = [] { return MetricsHttpServer::Page{"200 OK", "ok\n"}; };
  pages["/readyz"] = [&ready] {
    return ready ? MetricsHttpServer::Page{"200 OK", "ready\n"}
                 : MetricsHttpServer::Page{"503 Service Unavailable", "not ready\n"};
  };
  auto http = MetricsHttpServer::Start(
      "127.0.0.1:0", [] { return std::string("m 1\n"); }, absl::Milliseconds(300),
      std::move(pages));
  REQUIRE(http.ok());
  zrpc::testing::HttpResponse health = zrpc::testing::Curl(Url(**http, "/healthz"));
  CHECK(health.status == 200);
  CHECK(health.body == "ok\n");
  CHECK(absl::StrContains(health.headers, "Content-Type: text/plain; charset=utf-8"));
  CHECK(zrpc::testing::Curl(Url(**http, "/readyz")).body == "ready\n");
  ready = false;
  zrpc::testing::HttpResponse not_ready = zrpc::testing::Curl(Url(**http, "/readyz?verbose"));
  CHECK(not_ready.status == 503);
  CHECK(not_ready.body == "not ready\n");
  const std::string raw = Exchange((*http)->port(), "HEAD /readyz HTTP/1.1\r\n\r\n");
  CHECK(absl::StartsWith(raw, "HTTP/1.1 503 Service Unavailable\r\n"));
  CHECK(raw.find("\r\n\r\n") == raw.size() - 4);
  CHECK(zrpc::testing::Curl(Url(**http, "/metrics")).body == "m 1\n");
  CHECK(zrpc::testing::Curl(Url(**http, "/healthzx")).status == 404);
  CHECK((*http)->scrapes() == 5);
  CHECK((*http)->refused() == 1);
}

TEST_CASE("clients that never speak do not hold up a scrape, nor the endpoint's destruction") {
  Served s(absl::Seconds(2));
  std::vector<int> silent;
  for (int i = 0; i < 10; ++i) silent.push_back(Connect(s.http->port()));
  absl::SleepFor(absl::Milliseconds(50));
  const absl::Time start = absl::Now();
  zrpc::testing::HttpResponse r = zrpc::testing::Curl(Url(*s.http, "/metrics"));
  CHECK(r.status == 200);
  // Served beside them, not after 10 x 2 s of waiting on each in turn.
  CHECK(absl::Now() - start < absl::Seconds(2));
  const absl::Time before = absl::Now();
  s.http.reset();
  CHECK(absl::Now() - before < absl::Seconds(1));
  for (int fd : silent) close(fd);
}

TEST_CASE("an answer is not lost to a reset: a request with a body, and a 64 KiB head") {
  Served s;
  const std::string body(30000, 'b');
  const std::string reply = Exchange(
      s.http->port(),
      absl::StrCat("GET /metrics HTTP/1.1\r\nContent-Length: ", body.size(), "\r\n\r\n", body));
  CHECK(absl::StartsWith(reply, "HTTP/1.1 200 OK\r\n"));
  CHECK(absl::EndsWith(reply, s.metrics.PrometheusText()));
  const std::string huge =
      "GET /metrics HTTP/1.1\r\nX-Pad: " + std::string(64 * 1024, 'a') + "\r\n\r\n";
  CHECK(absl::StartsWith(Exchange(s.http->port(), huge), "HTTP/1.1 400 "));
}

TEST_CASE("malformed requests get 400; a head over 8 KiB gets 400 without being read further") {
  Served s;
  CHECK(absl::StartsWith(Exchange(s.http->port(), "hello\r\n\r\n"), "HTTP/1.1 400 "));
  CHECK(
      absl::StartsWith(Exchange(s.http->port(), "GET metrics HTTP/1.1\r\n\r\n"), "HTTP/1.1 400 "));
  CHECK(absl::StartsWith(Exchange(s.http->port(), "GET /metrics SPDY/3\r\n\r\n"), "HTTP/1.1 400 "));
  const std::string huge = "GET /metrics HTTP/1.1\r\nX-Pad: " +
                           std::string(MetricsHttpServer::kMaxRequestHead + 100, 'a') + "\r\n\r\n";
  CHECK(absl::StartsWith(Exchange(s.http->port(), huge), "HTTP/1.1 400 "));
  // Still serving.
  CHECK(zrpc::testing::Curl(Url(*s.http, "/metrics")).status == 200);
}

TEST_CASE("a client that connects and never speaks is dropped after io_timeout; scrapes go on") {
  Served s;
  const int silent = Connect(s.http->port());
  const absl::Time start = absl::Now();
  zrpc::testing::HttpResponse r = zrpc::testing::Curl(Url(*s.http, "/metrics"));
  CHECK(r.status == 200);
  CHECK(absl::Now() - start < absl::Seconds(5));  // io_timeout is 300 ms; curl's own limit 10 s
  char byte;
  CHECK(recv(silent, &byte, 1, 0) == 0);  // closed by the server, without a word
  close(silent);
  // Destruction with a silent client connected returns within io_timeout.
  const int another = Connect(s.http->port());
  absl::SleepFor(absl::Milliseconds(20));
  const absl::Time before = absl::Now();
  s.http.reset();
  CHECK(absl::Now() - before < absl::Seconds(3));
  close(another);
}

TEST_CASE("a malformed or taken address is refused with the reason") {
  auto render = [] { return std::string(); };
  auto no_port = MetricsHttpServer::Start("127.0.0.1", render);
  CHECK(no_port.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(absl::StrContains(no_port.status().message(), "host:port"));
  auto bad_port = MetricsHttpServer::Start("127.0.0.1:70000", render);
  CHECK(bad_port.status().code() == absl::StatusCode::kInvalidArgument);
  auto unbracketed = MetricsHttpServer::Start("::1:9464", render);
  CHECK(unbracketed.status().code() == absl::StatusCode::kInvalidArgument);
  for (const char* bad : {"127.0.0.1: 80", "127.0.0.1:+80", "127.0.0.1:", "127.0.0.1:0x50"}) {
    INFO(bad);
    CHECK(MetricsHttpServer::Start(bad, render).status().code() ==
          absl::StatusCode::kInvalidArgument);
  }

  auto first = MetricsHttpServer::Start("127.0.0.1:0", render);
  REQUIRE(first.ok());
  auto taken = MetricsHttpServer::Start(absl::StrCat("127.0.0.1:", (*first)->port()), render);
  CHECK(taken.status().code() == absl::StatusCode::kUnavailable);
  CHECK(absl::StrContains(taken.status().message(), "cannot listen"));
  auto foreign = MetricsHttpServer::Start("192.0.2.1:0", render);  // TEST-NET-1: not this host's
  CHECK(foreign.status().code() == absl::StatusCode::kUnavailable);
  for (absl::Duration bad : {absl::ZeroDuration(), absl::Seconds(-1), absl::InfiniteDuration()}) {
    auto timeout = MetricsHttpServer::Start("127.0.0.1:0", render, bad);
    CHECK(timeout.status().code() == absl::StatusCode::kInvalidArgument);
  }
}
