// call_counter: an LD_PRELOAD library that counts, for the whole life of the process it is loaded
// into, what benchmarks/count_calls.sh compares per call between programs it did not build:
// heap allocations (malloc, calloc, realloc, the aligned allocators, and so operator new, which
// libstdc++ builds on malloc), read and write system calls (the kernel's own count,
// /proc/self/io syscr and syscw, every thread included) and context switches (getrusage over
// every thread, voluntary and involuntary). At exit it appends one line to the file
// $ZRPC_COUNT_OUT names:
//
//   pid=<pid> comm=<name> allocs=<n> reads=<n> writes=<n> vcsw=<n> ivcsw=<n>
//
// Nothing here is timed, and nothing depends on the program's cooperation beyond returning from
// main or calling exit (the benchmarks' servers do so on SIGTERM). The counts include the
// program's setup: the script subtracts a run of N calls from one of 2N, which leaves N calls'
// worth of steady state, time-driven work (timers, keepalives) included.
//
// glibc's __libc_* entry points are the allocator proper; calling them avoids dlsym, which itself
// allocates. Counting is one relaxed atomic increment per allocation.
#include <fcntl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>

extern "C" {
void* __libc_malloc(size_t size);
void* __libc_calloc(size_t count, size_t size);
void* __libc_realloc(void* pointer, size_t size);
void* __libc_memalign(size_t alignment, size_t size);
void* __libc_valloc(size_t size);
void* __libc_pvalloc(size_t size);
}

namespace {

std::atomic<unsigned long long> allocations{0};

inline void Count() { allocations.fetch_add(1, std::memory_order_relaxed); }

// Reads "syscr: N" and "syscw: N" from /proc/self/io with raw system calls: stdio would allocate.
void ReadIo(unsigned long long* reads, unsigned long long* writes) {
  *reads = *writes = 0;
  const int fd = open("/proc/self/io", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return;
  char text[1024];
  const ssize_t n = read(fd, text, sizeof(text) - 1);
  close(fd);
  if (n <= 0) return;
  text[n] = '\0';
  if (const char* r = std::strstr(text, "syscr:")) *reads = std::strtoull(r + 6, nullptr, 10);
  if (const char* w = std::strstr(text, "syscw:")) *writes = std::strtoull(w + 6, nullptr, 10);
}

void Report() {
  const char* path = std::getenv("ZRPC_COUNT_OUT");
  if (path == nullptr || *path == '\0') return;
  const unsigned long long allocs = allocations.load(std::memory_order_relaxed);
  unsigned long long reads = 0, writes = 0;
  ReadIo(&reads, &writes);
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  char comm[64] = "?";
  if (const int fd = open("/proc/self/comm", O_RDONLY | O_CLOEXEC); fd >= 0) {
    const ssize_t n = read(fd, comm, sizeof(comm) - 1);
    close(fd);
    if (n > 0) comm[comm[n - 1] == '\n' ? n - 1 : n] = '\0';
  }
  char line[256];
  const int length = std::snprintf(
      line, sizeof(line), "pid=%d comm=%s allocs=%llu reads=%llu writes=%llu vcsw=%ld ivcsw=%ld\n",
      static_cast<int>(getpid()), comm, allocs, reads, writes, usage.ru_nvcsw, usage.ru_nivcsw);
  const int fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) return;
  // One write of one short line to an O_APPEND file: lines of processes ending together do not mix.
  ssize_t written = write(fd, line, static_cast<size_t>(length));
  static_cast<void>(written);
  close(fd);
}

// Registered from a constructor so that it runs late at exit: after main's objects are gone.
__attribute__((constructor)) void Install() { std::atexit(Report); }

}  // namespace

extern "C" {

void* malloc(size_t size) {
  Count();
  return __libc_malloc(size);
}

void* calloc(size_t count, size_t size) {
  Count();
  return __libc_calloc(count, size);
}

void* realloc(void* pointer, size_t size) {
  Count();
  return __libc_realloc(pointer, size);
}

void* memalign(size_t alignment, size_t size) {
  Count();
  return __libc_memalign(alignment, size);
}

void* aligned_alloc(size_t alignment, size_t size) {
  Count();
  return __libc_memalign(alignment, size);
}

int posix_memalign(void** out, size_t alignment, size_t size) {
  if (alignment < sizeof(void*) || (alignment & (alignment - 1)) != 0) return EINVAL;
  Count();
  void* p = __libc_memalign(alignment, size);
  if (p == nullptr) return ENOMEM;
  *out = p;
  return 0;
}

void* valloc(size_t size) {
  Count();
  return __libc_valloc(size);
}

void* pvalloc(size_t size) {
  Count();
  return __libc_pvalloc(size);
}

}  // extern "C"
