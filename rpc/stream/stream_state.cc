// StreamState: one end of a stream: the peer's messages and per-stream flow control.

#include "rpc/stream/stream_state.h"

#include <algorithm>
#include <limits>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "rpc/common/monotonic.h"

namespace zrpc::internal {
namespace {

// Waits on `cv` until `deadline` (monotonic); false once it has passed.
bool WaitUntil(absl::CondVar& cv, absl::Mutex& mu, absl::Time deadline) {
  if (deadline == absl::InfiniteFuture()) {
    cv.Wait(&mu);
    return true;
  }
  const absl::Duration left = deadline - MonotonicNow();
  if (left <= absl::ZeroDuration()) return false;
  cv.WaitWithTimeout(&mu, left);
  return true;
}

constexpr uint32_t kMaxSendCredit = uint32_t{1} << 31;

}  // namespace

StreamState::StreamState(const google::protobuf::MessageLite* read_prototype, uint16_t window,
                         uint32_t send_credit)
    : prototype_(read_prototype),
      window_(std::max<uint16_t>(window, 1)),
      receivable_(read_prototype == nullptr ? 0 : window_),
      send_credit_(send_credit) {}

StreamState::~StreamState() {
  for (Queued& queued : queue_) {
    if (queued.hold) queued.hold();
  }
}

uint16_t StreamState::Consumed() {
  ++owed_;
  // A frame per half window: few frames, and the sender never waits for one while it still
  // has half a window to send.
  const uint32_t threshold = std::max<uint32_t>(window_ / 2, 1);
  if (owed_ < threshold) return 0;
  const uint16_t grant = static_cast<uint16_t>(std::min<uint32_t>(owed_, 0xffff));
  owed_ -= grant;
  receivable_ += grant;
  return grant;
}

std::shared_ptr<StreamListener> StreamState::Changed() {
  changed_.SignalAll();
  return has_listener_ ? listener_.lock() : nullptr;
}

absl::Status StreamState::AdmitLocked() {
  if (prototype_ == nullptr) {
    return absl::FailedPreconditionError("a stream message on a stream that takes none");
  }
  if (receivable_ == 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("a stream message past the window granted (", window_, " messages)"));
  }
  if (peer_done_ && !ended_) {
    return absl::FailedPreconditionError("a stream message after the sender's half-close");
  }
  --receivable_;
  return absl::OkStatus();
}

std::optional<uint16_t> StreamState::DropLocked(std::shared_ptr<StreamListener>* listener) {
  if (ended_) return 0;  // nobody reads any more: dropped (the call's end made it moot)
  if (!draining_) return std::nullopt;
  const uint16_t grant = Consumed();
  if (!has_listener_ || grant == 0) return grant;
  // The asynchronous form sends it (TakeDrainedCredit), from its pump.
  drained_credit_ += grant;
  *listener = Changed();
  return 0;
}

absl::Status StreamState::ParseLocked(absl::Span<const uint8_t> body,
                                      std::unique_ptr<google::protobuf::MessageLite>* out) {
  std::unique_ptr<google::protobuf::MessageLite> message;
  if (!spare_.empty()) {
    message = std::move(spare_.back());
    spare_.pop_back();
  } else {
    message.reset(prototype_->New());
  }
  if (body.size() > static_cast<size_t>(std::numeric_limits<int>::max()) ||
      !message->ParseFromArray(body.data(), static_cast<int>(body.size()))) {
    spare_.push_back(std::move(message));
    return absl::InvalidArgumentError(
        absl::StrCat("malformed stream message: it does not parse as ", prototype_->GetTypeName()));
  }
  *out = std::move(message);
  return absl::OkStatus();
}

absl::StatusOr<uint16_t> StreamState::OnMessage(absl::Span<const uint8_t> body) {
  std::shared_ptr<StreamListener> listener;
  absl::ReleasableMutexLock lock(&mu_);
  if (absl::Status admitted = AdmitLocked(); !admitted.ok()) return admitted;
  if (std::optional<uint16_t> dropped = DropLocked(&listener)) {
    lock.Release();
    Notify(listener);
    return *dropped;
  }
  std::unique_ptr<google::protobuf::MessageLite> message;
  if (absl::Status parsed = ParseLocked(body, &message); !parsed.ok()) return parsed;
  queue_.push_back({std::move(message), nullptr, IncomingBulk()});
  listener = Changed();
  lock.Release();
  Notify(listener);
  return 0;
}

absl::StatusOr<uint16_t> StreamState::OnPulling(bool* wanted) {
  *wanted = false;
  std::shared_ptr<StreamListener> listener;
  absl::ReleasableMutexLock lock(&mu_);
  if (absl::Status admitted = AdmitLocked(); !admitted.ok()) return admitted;
  if (std::optional<uint16_t> dropped = DropLocked(&listener)) {
    lock.Release();
    Notify(listener);
    return *dropped;
  }
  // Its place, empty until it lands: Read waits there, so nothing behind it overtakes it.
  queue_.push_back({nullptr, nullptr, IncomingBulk()});
  ++pulling_;
  *wanted = true;
  return 0;
}

absl::Status StreamState::OnPulledMessage(absl::Span<const uint8_t> body,
                                          std::function<void()> hold, IncomingBulk bulk) {
  std::shared_ptr<StreamListener> listener;
  absl::ReleasableMutexLock lock(&mu_);
  // The oldest place (a stream's pulls land in order: one queue pair's READs complete in
  // order). None: drained or ended meanwhile, and credited back then if owed.
  auto place = std::find_if(queue_.begin(), queue_.end(),
                            [](const Queued& queued) { return queued.message == nullptr; });
  if (place == queue_.end()) {
    lock.Release();
    if (hold) hold();
    return absl::OkStatus();  // `bulk` goes with this frame, outside the lock
  }
  --pulling_;
  absl::Status parsed = ParseLocked(body, &place->message);
  std::function<void()> unkept;  // (a moved-from std::function need not be empty)
  if (parsed.ok()) {
    place->hold = std::move(hold);
    place->bulk = std::move(bulk);
  } else {
    queue_.erase(place);
    unkept = std::move(hold);
  }
  listener = Changed();
  lock.Release();
  // Not kept (it did not parse): outside the lock, it deregisters memory (as `bulk` does, on
  // the way out).
  if (unkept) unkept();
  Notify(listener);
  return parsed;
}

absl::Status StreamState::OnHalfClose() {
  std::shared_ptr<StreamListener> listener;
  {
    absl::MutexLock lock(&mu_);
    // Never legitimate, even after the end (a first half-close may race the end; a second may
    // not), though once the call has retired its frames are dropped before they get here.
    if (peer_done_) return absl::FailedPreconditionError("a second half-close");
    peer_done_ = true;
    listener = Changed();
  }
  Notify(listener);
  return absl::OkStatus();
}

absl::Status StreamState::OnCredit(uint16_t messages) {
  std::shared_ptr<StreamListener> listener;
  {
    absl::MutexLock lock(&mu_);
    if (uint64_t{send_credit_} + messages > kMaxSendCredit) {
      return absl::FailedPreconditionError(
          absl::StrCat("stream credit past 2^31 messages (", send_credit_, " + ", messages, ")"));
    }
    send_credit_ += messages;
    listener = Changed();
  }
  Notify(listener);
  return absl::OkStatus();
}

uint16_t StreamState::Grant(const google::protobuf::MessageLite* read_prototype) {
  absl::MutexLock lock(&mu_);
  prototype_ = read_prototype;
  receivable_ += window_;
  return window_;
}

absl::Status StreamState::WaitEnded() {
  absl::MutexLock lock(&mu_);
  while (!ended_) changed_.Wait(&mu_);
  return stopped_ ? stop_status_ : status_;
}

void StreamState::End(absl::Status status) {
  std::shared_ptr<StreamListener> listener;
  {
    absl::MutexLock lock(&mu_);
    if (ended_) return;
    ended_ = true;
    status_ = std::move(status);
    listener = Changed();
  }
  Notify(listener);
}

void StreamState::MarkOpened() {
  std::shared_ptr<StreamListener> listener;
  {
    absl::MutexLock lock(&mu_);
    opened_.store(true, std::memory_order_release);
    listener = Changed();
  }
  Notify(listener);
}

bool StreamState::WaitOpened() {
  if (opened()) return true;
  absl::MutexLock lock(&mu_);
  auto done = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return ended_ || opened_.load(std::memory_order_relaxed);
  };
  mu_.Await(absl::Condition(&done));
  return opened_.load(std::memory_order_relaxed);
}

void StreamState::SetListener(std::weak_ptr<StreamListener> listener) {
  std::shared_ptr<StreamListener> now;
  {
    absl::MutexLock lock(&mu_);
    listener_ = std::move(listener);
    has_listener_ = true;
    now = listener_.lock();
  }
  Notify(now);
}

google::protobuf::MessageLite* StreamState::PopFront(uint16_t* grant, std::function<void()>* hold,
                                                     IncomingBulk* bulk) {
  current_ = std::move(queue_.front().message);
  *hold = std::move(queue_.front().hold);  // read now: what was held for it goes
  *bulk = std::move(queue_.front().bulk);
  queue_.pop_front();
  if (!ended_) *grant = Consumed();
  return current_.get();
}

google::protobuf::MessageLite* StreamState::Read(absl::Time deadline, uint16_t* grant,
                                                 IncomingBulk* bulk) {
  *grant = 0;
  if (bulk != nullptr) bulk->Reset();
  std::function<void()> hold;
  IncomingBulk payload;  // released outside the lock unless the reader takes it
  google::protobuf::MessageLite* message = nullptr;
  {
    absl::MutexLock lock(&mu_);
    if (current_ != nullptr) spare_.push_back(std::move(current_));
    // A message still being pulled holds its place: wait for it, unless the stream ended (its
    // pull may never land: a failing connection discards it).
    while (queue_.empty() || queue_.front().message == nullptr) {
      if (ended_ || stopped_ || (queue_.empty() && peer_done_)) return nullptr;
      if (!WaitUntil(changed_, mu_, deadline)) return nullptr;
    }
    if (stopped_) return nullptr;
    message = PopFront(grant, &hold, &payload);
  }
  if (hold) hold();  // outside the lock: it deregisters memory
  if (bulk != nullptr) *bulk = std::move(payload);
  return message;
}

google::protobuf::MessageLite* StreamState::TryRead(uint16_t* grant, bool* finished,
                                                    IncomingBulk* bulk) {
  *grant = 0;
  if (bulk != nullptr) bulk->Reset();
  std::function<void()> hold;
  IncomingBulk payload;  // released outside the lock unless the reader takes it
  google::protobuf::MessageLite* message = nullptr;
  {
    absl::MutexLock lock(&mu_);
    if (current_ != nullptr) spare_.push_back(std::move(current_));
    if (stopped_ || queue_.empty() || queue_.front().message == nullptr) {
      *finished = ended_ || stopped_ || (queue_.empty() && peer_done_);
      return nullptr;
    }
    *finished = false;
    message = PopFront(grant, &hold, &payload);
  }
  if (hold) hold();  // outside the lock: it deregisters memory
  if (bulk != nullptr) *bulk = std::move(payload);
  return message;
}

StreamState::Credit StreamState::TryTakeSendCredit() {
  absl::MutexLock lock(&mu_);
  if (ended_ || stopped_) return Credit::kEnded;
  if (send_credit_ == 0) return Credit::kNone;
  --send_credit_;
  return Credit::kTaken;
}

bool StreamState::TakeSendCredit(absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  while (send_credit_ == 0) {
    if (ended_ || stopped_) return false;
    if (!WaitUntil(changed_, mu_, deadline)) return false;
  }
  if (ended_ || stopped_) return false;
  --send_credit_;
  return true;
}

void StreamState::Stop(absl::Status status) {
  std::shared_ptr<StreamListener> listener;
  {
    absl::MutexLock lock(&mu_);
    if (stopped_) return;
    stopped_ = true;
    stop_status_ = std::move(status);
    listener = Changed();
  }
  Notify(listener);
}

uint16_t StreamState::Drain() {
  std::vector<std::function<void()>> holds;
  std::vector<IncomingBulk> payloads;  // released with `holds`, outside the lock
  absl::ReleasableMutexLock lock(&mu_);
  draining_ = true;
  uint16_t grant = 0;
  while (!queue_.empty()) {
    if (queue_.front().hold) holds.push_back(std::move(queue_.front().hold));
    if (!queue_.front().bulk.empty()) payloads.push_back(std::move(queue_.front().bulk));
    if (queue_.front().message != nullptr) {
      spare_.push_back(std::move(queue_.front().message));
    } else {
      --pulling_;  // dropped as it lands (OnPulledMessage finds no place)
    }
    queue_.pop_front();
    if (!ended_) grant = static_cast<uint16_t>(std::min<uint32_t>(grant + Consumed(), 0xffff));
  }
  lock.Release();
  for (std::function<void()>& hold : holds) hold();  // outside the lock: they deregister memory
  payloads.clear();
  return grant;
}

uint32_t StreamState::TakeDrainedCredit() {
  absl::MutexLock lock(&mu_);
  return std::exchange(drained_credit_, 0);
}

bool StreamState::ended() const {
  absl::MutexLock lock(&mu_);
  return ended_;
}

absl::Status StreamState::status() const {
  absl::MutexLock lock(&mu_);
  return stopped_ && ended_ ? stop_status_ : status_;
}

bool StreamState::sends_over() const {
  absl::MutexLock lock(&mu_);
  return ended_ || stopped_;
}

bool StreamState::pulling() const {
  absl::MutexLock lock(&mu_);
  return pulling_ > 0;
}

bool StreamState::peer_done() const {
  absl::MutexLock lock(&mu_);
  return peer_done_ || ended_;
}

}  // namespace zrpc::internal
