// ParkDoors: where the peers of a poller's parked windows knock (credits.h, "Parked windows").
//
// Why. A parked window has no credit: its peer cannot send even a credit frame to ask for one,
// since any SEND consumes a receive of the shared queue that no credit backs. An RDMA WRITE
// without immediate consumes none: the peer writes its knock into an 8-byte door of the poller's,
// and the poller looks at the doors of its parked connections (a load each) while any is parked.
// No completion tells the poller a knock landed, so it looks every millisecond while some window
// is parked, and not at all otherwise: a knock is answered within about a millisecond plus the
// grant's trip.
//
// The doors of a poller are one registration (LOCAL_WRITE and REMOTE_WRITE, nothing else): every
// peer of the poller may write any door. A knock carries its connection's random token, but the
// poller opens a parked window whenever its door changes, whatever it holds: a peer that
// overwrites another's door can have it opened needlessly (its floor back in use until it idles
// and parks again, counted in foreign_knocks) but never keeps a knock from being seen. A window
// opened so lends a floor of the budget's, like any other: no receive is ever promised twice.
//
// Thread-safe: Take and Give under the caller's lock; Read from any thread.
#ifndef ZRPC_TRANSPORT_PARK_DOORS_H_
#define ZRPC_TRANSPORT_PARK_DOORS_H_

#include <infiniband/verbs.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "transport/verbs_owners.h"
#include "transport/wire.h"

namespace zrpc::transport {

class ParkDoors {
 public:
  // `count` doors, registered on `pd` (null: unregistered, for host tests).
  static absl::StatusOr<std::unique_ptr<ParkDoors>> Create(ibv_pd* pd, uint32_t count);
  ParkDoors(const ParkDoors&) = delete;
  ParkDoors& operator=(const ParkDoors&) = delete;

  // A free door, zeroed, with a fresh random token; nullopt when all are taken.
  struct Lease {
    uint32_t index = 0;
    uint32_t token = 0;
  };
  std::optional<Lease> Take();
  void Give(uint32_t index);

  // What the peer is told (wire.h, ParkDoor).
  ParkDoor Describe(const Lease& lease) const;
  // The door's 8 bytes as the last knock left them (0: never knocked).
  uint64_t Read(uint32_t index) const;
  // A knock as the peer's WRITE would leave it, for host tests.
  void KnockForTest(uint32_t index, uint64_t value);

  uint32_t count() const { return count_; }
  uint32_t taken() const { return taken_; }
  size_t bytes() const { return size_t{count_} * 8; }

 private:
  ParkDoors(uint32_t count, PageBuffer memory);

  const uint32_t count_;
  PageBuffer memory_;
  MrOwner mr_;
  std::vector<uint32_t> free_;
  uint32_t taken_ = 0;
  uint64_t token_state_;
};

}  // namespace zrpc::transport

#endif  // ZRPC_TRANSPORT_PARK_DOORS_H_
