// HealthService: statuses by name, and the watchers told of their changes (health_service.h).

#include "rpc/health/health_service.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace zrpc::internal {

// One Watch. `claimed` says a thread owns it: it has a Write out, or is about to start one or to
// finish the stream. Only the claiming thread touches `call` and `out`, and only it deletes the
// watcher, so a watcher found in watchers_ unclaimed may be claimed under the mutex and used
// outside it.
struct HealthService::Watcher {
  std::unique_ptr<ServerAsyncWriter<Request, Response>> call;
  std::string name;
  Response out;          // the message of the Write out: alive until its callback
  bool claimed = false;  // under mu_
  int sent = -1;         // the status last written, under mu_; -1 before the first
  bool cancelled = false;
};

HealthService::~HealthService() {
  // Writes still out complete through OnWritten, which takes this object: wait for them. In a
  // server there are none by now: its Shutdown, in its destructor too, ends every watcher and
  // waits for every call before anything is destroyed.
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(
      +[](absl::flat_hash_set<Watcher*>* watchers) { return watchers->empty(); }, &watchers_));
}

HealthService::Status HealthService::StatusOf(absl::string_view name) const {
  auto it = statuses_.find(name);
  return it == statuses_.end() ? health::v1::HealthCheckResponse::SERVICE_UNKNOWN : it->second;
}

HealthService::Status HealthService::Get(absl::string_view name, bool* known) const {
  absl::MutexLock lock(&mu_);
  *known = statuses_.contains(name);
  return StatusOf(name);
}

size_t HealthService::watchers() const {
  absl::MutexLock lock(&mu_);
  return watchers_.size();
}

HealthService::Next HealthService::NextFor(Watcher* watcher) {
  if (watcher->cancelled) {
    watchers_.erase(watcher);
    return Next::kFinish;
  }
  const Status now = StatusOf(watcher->name);
  if (now != watcher->sent) {
    watcher->sent = now;
    watcher->out.set_status(now);
    return Next::kWrite;
  }
  if (shut_down_) {
    watchers_.erase(watcher);
    return Next::kFinish;
  }
  watcher->claimed = false;
  return Next::kNothing;
}

void HealthService::Run(Watcher* watcher, Next next) {
  switch (next) {
    case Next::kNothing:
      return;
    case Next::kWrite:
      // The callback may run here and now: the mutex is not held.
      watcher->call->Write(watcher->out, [this, watcher](bool ok) { OnWritten(watcher, ok); });
      return;
    case Next::kFinish:
      watcher->call->Finish(watcher->cancelled ? absl::CancelledError("the watcher went away")
                                               : absl::OkStatus());
      delete watcher;
      return;
  }
}

void HealthService::OnWritten(Watcher* watcher, bool ok) {
  Next next;
  {
    absl::MutexLock lock(&mu_);
    if (!ok) watcher->cancelled = true;  // the client went or gave up
    next = NextFor(watcher);
  }
  Run(watcher, next);
}

void HealthService::Set(absl::string_view name, Status status) {
  {
    absl::MutexLock lock(&mu_);
    if (shut_down_) return;
    statuses_[name] = status;
  }
  kick_();
}

void HealthService::SetIfUnset(absl::string_view name, Status status) {
  {
    absl::MutexLock lock(&mu_);
    if (shut_down_ || !statuses_.try_emplace(name, status).second) return;
  }
  kick_();
}

void HealthService::Shutdown() {
  {
    absl::MutexLock lock(&mu_);
    if (shut_down_) return;
    shut_down_ = true;
    for (auto& [name, status] : statuses_) status = health::v1::HealthCheckResponse::NOT_SERVING;
    statuses_[""] = health::v1::HealthCheckResponse::NOT_SERVING;
  }
  kick_();
}

void HealthService::Flush() {
  std::vector<std::pair<Watcher*, Next>> actions;
  {
    absl::MutexLock lock(&mu_);
    std::vector<Watcher*> idle;
    for (Watcher* watcher : watchers_) {
      if (!watcher->claimed) idle.push_back(watcher);
    }
    for (Watcher* watcher : idle) {
      watcher->claimed = true;
      // A client that gave up, or whose connection went: nothing else would tell this one.
      if (watcher->call->context().IsCancelled()) watcher->cancelled = true;
      const Next next = NextFor(watcher);  // may erase it from watchers_: collected first
      if (next != Next::kNothing) actions.emplace_back(watcher, next);
    }
  }
  for (auto& [watcher, next] : actions) Run(watcher, next);
}

void HealthService::Check(std::unique_ptr<PendingCall<Request, Response>> call) {
  bool known = false;
  const Status status = Get(call->request().service(), &known);
  if (!known) {
    call->Finish(absl::NotFoundError(
        absl::StrCat("the server knows no service \"", call->request().service(), "\"")));
    return;
  }
  call->response()->set_status(status);
  call->Finish(absl::OkStatus());
}

void HealthService::Watch(std::unique_ptr<ServerAsyncWriter<Request, Response>> call) {
  auto* watcher = new Watcher;
  watcher->name = call->request().service();
  watcher->call = std::move(call);
  {
    absl::MutexLock lock(&mu_);
    watchers_.insert(watcher);  // its first Write (sent is -1) at the next Flush
  }
  kick_();
}

}  // namespace zrpc::internal
