// Unpredictable values for what a peer must not guess: a memory window's key byte, a park door's
// token and armed value. They come from the kernel's generator (getrandom(2), never a file
// descriptor, so none is spent at 10,000 connections), a block at a time per thread, so a value
// costs a system call only once per 64 bytes. Not for the hot path's timing jitter or backoff,
// where a seeded PRNG is enough.
//
// Where getrandom is refused (a sandbox's seccomp profile), /dev/urandom; where both are, a mix of
// the clock and a counter: values that still differ from one another, so nothing waiting for a
// fresh one hangs, but that a peer could guess.
//
// Thread-safe: each thread draws from its own block.
#ifndef ZRPC_TRANSPORT_KERNEL_RANDOM_H_
#define ZRPC_TRANSPORT_KERNEL_RANDOM_H_

#include <cstddef>
#include <cstdint>

namespace zrpc::transport {

// `size` bytes from the kernel's generator into `out`.
void KernelRandomBytes(void* out, size_t size);

// A random byte, or 8 bytes as one value.
uint8_t KernelRandomByte();
uint64_t KernelRandom64();

}  // namespace zrpc::transport

#endif  // ZRPC_TRANSPORT_KERNEL_RANDOM_H_
