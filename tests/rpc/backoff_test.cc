// ReconnectBackoff (rpc/client/backoff.h): delays that double from `initial` up to `max`, each
// attempt allowed after a time drawn from [d/2, d], and a success that starts over.
#include "rpc/client/backoff.h"

#include <catch2/catch.hpp>

namespace {

using zrpc::internal::ReconnectBackoff;

TEST_CASE("the delay doubles per failure up to max, and each wait is within [d/2, d]",
          "[backoff]") {
  ReconnectBackoff backoff(absl::Milliseconds(50), absl::Seconds(1));
  CHECK(backoff.delay() == absl::ZeroDuration());
  const absl::Time now = absl::UnixEpoch() + absl::Hours(1);
  const absl::Duration expected[] = {absl::Milliseconds(50),  absl::Milliseconds(100),
                                     absl::Milliseconds(200), absl::Milliseconds(400),
                                     absl::Milliseconds(800), absl::Seconds(1),
                                     absl::Seconds(1)};
  for (absl::Duration d : expected) {
    const absl::Time next = backoff.Failed(now);
    INFO("delay " << absl::FormatDuration(d));
    CHECK(backoff.delay() == d);
    CHECK(next >= now + d / 2);
    CHECK(next <= now + d);
  }
}

TEST_CASE("a success starts the backoff over", "[backoff]") {
  ReconnectBackoff backoff(absl::Milliseconds(10), absl::Seconds(5));
  for (int i = 0; i < 5; ++i) backoff.Failed(absl::UnixEpoch());
  CHECK(backoff.delay() == absl::Milliseconds(160));
  backoff.Succeeded();
  CHECK(backoff.delay() == absl::ZeroDuration());
  backoff.Failed(absl::UnixEpoch());
  CHECK(backoff.delay() == absl::Milliseconds(10));
}

TEST_CASE("thousands of failures neither overflow nor pass max", "[backoff]") {
  ReconnectBackoff backoff(absl::Milliseconds(50), absl::Seconds(5));
  for (int i = 0; i < 5000; ++i) backoff.Failed(absl::UnixEpoch());
  CHECK(backoff.delay() == absl::Seconds(5));
}

TEST_CASE("the jitter is drawn, not fixed: waits differ across attempts", "[backoff]") {
  // Two backoffs at the same delay: 64 draws each from [d/2, d] cannot all coincide.
  ReconnectBackoff a(absl::Seconds(1), absl::Seconds(1));
  bool differ = false;
  absl::Time first = a.Failed(absl::UnixEpoch());
  for (int i = 0; i < 64 && !differ; ++i) differ = a.Failed(absl::UnixEpoch()) != first;
  CHECK(differ);
}

TEST_CASE("after a loss the wait is drawn from [initial/2, initial], and counts no failure",
          "[backoff]") {
  ReconnectBackoff backoff(absl::Milliseconds(40), absl::Seconds(5));
  const absl::Time now = absl::UnixEpoch();
  bool differ = false;
  const absl::Time first = backoff.AfterLoss(now);
  for (int i = 0; i < 64; ++i) {
    const absl::Time at = backoff.AfterLoss(now);
    CHECK(at >= now + absl::Milliseconds(20));
    CHECK(at <= now + absl::Milliseconds(40));
    differ = differ || at != first;
  }
  CHECK(differ);
  CHECK(backoff.delay() == absl::ZeroDuration());
  backoff.Failed(now);
  CHECK(backoff.delay() == absl::Milliseconds(40));  // the first failure's, as before any loss
}

}  // namespace
