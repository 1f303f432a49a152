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
// poller opens a parked window whenever its door changes from the value it armed it with,
// whatever it holds: a peer that overwrites another's door can have it opened needlessly (its
// floor back in use until it idles and parks again, counted in foreign_knocks). To hide a knock
// it would have to write the armed value back before the poller looks: a random 64-bit value
// that no peer is told or can read (the doors take no REMOTE_READ), drawn afresh each time a
// knock is heard (Rearm). A window opened so lends a floor of the budget's, like any other: no
// receive is ever promised twice.
//
// Thread-safe: Take, Give and Rearm under the caller's lock; Read from any thread.
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

  // A free door, armed, with a fresh random token; nullopt when all are taken.
  struct Lease {
    uint32_t index = 0;
    uint32_t token = 0;
  };
  std::optional<Lease> Take();
  void Give(uint32_t index);

  // What the peer is told (wire.h, ParkDoor).
  ParkDoor Describe(const Lease& lease) const;
  // The door's 8 bytes as the last knock left them, and the value it was armed with: a door that
  // holds another was written (a knock).
  uint64_t Read(uint32_t index) const;
  uint64_t armed(uint32_t index) const { return armed_[index]; }
  // After a knock: the door armed again with a fresh value (what it holds then is replaced
  // atomically, so a write that lands meanwhile still changes it from the new value or is the
  // knock being answered).
  void Rearm(uint32_t index);
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
  std::vector<uint64_t> armed_;
  uint32_t taken_ = 0;
};

}  // namespace zrpc::transport

#endif  // ZRPC_TRANSPORT_PARK_DOORS_H_
