// Ring<T>: a FIFO on a growable circular array, for the connection's send-side queues.
//
// Why not std::deque: a deque allocates a block whenever its tail crosses into a new one and
// frees blocks its head leaves, so a queue that merely flows -- push one, pop one, forever --
// allocates and frees a block every 512 bytes of traffic (every 12-16 work requests here). A
// ring's memory grows to the most elements it ever held and stays: in steady state it allocates
// nothing. T is copied in and out; keep it a small plain struct.
#ifndef ZRPC_TRANSPORT_RING_H_
#define ZRPC_TRANSPORT_RING_H_

#include <cstddef>
#include <utility>
#include <vector>

namespace zrpc::transport {

template <typename T>
class Ring {
 public:
  bool empty() const { return size_ == 0; }
  size_t size() const { return size_; }
  // Element `i` from the front; i < size().
  T& operator[](size_t i) { return slots_[(head_ + i) & mask_]; }
  const T& operator[](size_t i) const { return slots_[(head_ + i) & mask_]; }
  T& front() { return (*this)[0]; }
  const T& front() const { return (*this)[0]; }
  T& back() { return (*this)[size_ - 1]; }

  void push_back(const T& value) {
    if (size_ == slots_.size()) Grow();
    slots_[(head_ + size_) & mask_] = value;
    ++size_;
  }
  void pop_front() {
    head_ = (head_ + 1) & mask_;
    --size_;
  }
  void clear() {
    head_ = 0;
    size_ = 0;
  }
  // Removes elements [first, last) from the front's count, keeping the order of the rest.
  void erase(size_t first, size_t last) {
    const size_t gap = last - first;
    for (size_t i = last; i < size_; ++i) (*this)[i - gap] = (*this)[i];
    size_ -= gap;
  }

 private:
  void Grow() {
    std::vector<T> bigger(slots_.empty() ? 16 : 2 * slots_.size());
    for (size_t i = 0; i < size_; ++i) bigger[i] = (*this)[i];
    slots_ = std::move(bigger);
    mask_ = slots_.size() - 1;
    head_ = 0;
  }

  std::vector<T> slots_;  // a power of two in size
  size_t mask_ = 0;
  size_t head_ = 0;
  size_t size_ = 0;
};

}  // namespace zrpc::transport

#endif  // ZRPC_TRANSPORT_RING_H_
