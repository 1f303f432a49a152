#!/usr/bin/env python3
"""Reads callgrind dumps of count_instructions' phases; prints what zrpc did per round trip.

    callgrind_counts.py CALLS DUMP...

Each DUMP is one phase of CALLS round trips, recorded with fakeverbs' entry points toggled out
(count_instructions.sh): nothing the stand-in device does is in it. For each it prints one line
of figures per round trip, tab-separated, after a header:

  ir          instructions executed (by the thread that drove the phase: below)
  allocs      calls to malloc, calloc, realloc, aligned_alloc, posix_memalign, memalign,
              operator new (every allocating form; not placement new)
  locks       mutex acquisitions: absl::Mutex (Lock, ReaderLock, TryLock) and
              pthread_mutex_lock/trylock (std::mutex's)
  clocks      clock reads: clock_gettime, gettimeofday, absl::Now / GetCurrentTimeNanos,
              std::chrono's steady_clock / system_clock::now (one read each, however nested)
  syscalls    system calls made through libc's syscall() (absl's futex waits and wakes)
  atomics     atomic read-modify-write instructions executed: x86's lock-prefixed ones and
              xchg with a memory operand (implicitly locked), found by disassembling each object
              with objdump and summing callgrind's per-instruction counts (the dumps need
              --dump-instr=yes); in every object, the mutexes' own included
  atomics_zrpc  the part of `atomics` in the counted program's own binary: zrpc's code and what
              it inlines (shared_ptr counts, std::atomic), not Abseil's or libc's libraries
  entries     entries into a connection's serialization domain (transport/serial_domain.h): a
              poller's completion batch (Connection::RunBatchLocked) and every other entry, which
              lets go through Connection::ExitLocked; an operation run inside a domain already
              held (a handler's send, a task in the batch) is not one
  wakes       ways one thread wakes another: condition variables signalled (pthread_cond_signal
              and _broadcast, std::condition_variable's notify_one and notify_all, absl::CondVar's
              Signal and SignalAll) and write(2) calls (an eventfd's or a pipe's), however nested

count_instructions.sh records each thread apart (--separate-threads=yes), and a phase's dump is
the thread that drove it alone: the threads that run by the clock (a channel's timer and
restorer, the server's sweeper) are not in it, whenever their passes fall. What a call could
hand to another thread it must wake it for: `wakes` counts that.
"""

import os
import re
import subprocess
import sys

# operator new in every allocating form; placement new (", void*)") allocates nothing.
ALLOC = re.compile(
    r"^(malloc|calloc|realloc|aligned_alloc|posix_memalign|memalign|"
    r"operator new(\[\])?\(unsigned long(, std::align_val_t)?(, std::nothrow_t const&)?\))$")
LOCK = re.compile(
    r"^(absl::[a-z_0-9]+::Mutex::(Lock|ReaderLock|TryLock|ReaderTryLock)\(\)|"
    r"pthread_mutex_lock|pthread_mutex_trylock|__pthread_mutex_lock|___pthread_mutex_lock|"
    r"__pthread_mutex_trylock)$")
CLOCK = re.compile(
    r"^(clock_gettime|__clock_gettime|__clock_gettime64|gettimeofday|__gettimeofday|"
    r"absl::[a-z_0-9]+::Now\(\)|absl::[a-z_0-9]+::GetCurrentTimeNanos\(\)|"
    r"std::chrono::_V2::(steady|system)_clock::now\(\))$")
SYSCALL = re.compile(r"^syscall$")
WAKE = re.compile(
    r"^(pthread_cond_signal|pthread_cond_broadcast|__pthread_cond_signal|__pthread_cond_broadcast|"
    r"std::condition_variable::notify_(one|all)\(\)|"
    r"absl::[a-z_0-9]+::CondVar::Signal(All)?\(\)|write|__write|__libc_write)$")
ENTRY = re.compile(
    r"^zrpc::transport::Connection::(RunBatchLocked\(absl::[a-z_0-9]+::Span<ibv_wc const>\)|"
    r"ExitLocked\(\))$")


# An x86 atomic read-modify-write in objdump's AT&T listing: a lock prefix, or xchg with memory.
ATOMIC = re.compile(r"^\s*([0-9a-f]+):\s+(lock\b|xchg\w*\s+\S*\()")
_atomic_addresses = {}


def atomic_addresses(obj):
    """Addresses (as callgrind dumps them: the file's own) of obj's atomic instructions."""
    if obj not in _atomic_addresses:
        found = set()
        try:
            listing = subprocess.run(["objdump", "-d", "--no-show-raw-insn", obj],
                                     capture_output=True, text=True, check=True).stdout
        except (OSError, subprocess.CalledProcessError) as e:
            sys.exit(f"callgrind_counts.py: cannot disassemble {obj}: {e}")
        for line in listing.splitlines():
            m = ATOMIC.match(line)
            if m:
                found.add(int(m.group(1), 16))
        _atomic_addresses[obj] = found
    return _atomic_addresses[obj]


def read(path, program=None):
    totals = None
    counts = {"allocs": 0, "locks": 0, "clocks": 0, "syscalls": 0, "atomics": 0,
              "atomics_zrpc": 0, "entries": 0, "wakes": 0}
    caller = ""
    callee = ""
    names = {}
    objects = {}
    obj = ""
    atomic = set()
    in_program = False
    skip_cost_line = False  # the line after calls= is the call's inclusive cost, not an instruction
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            line = line.rstrip("\n")
            if line.startswith("0x"):
                if skip_cost_line:
                    skip_cost_line = False
                    continue
                fields = line.split()
                if atomic and int(fields[0], 16) in atomic:
                    n = int(fields[-1])
                    counts["atomics"] += n
                    if in_program:
                        counts["atomics_zrpc"] += n
                continue
            if line.startswith("ob="):
                obj = resolve(line[3:], objects, keep_version=True)
                atomic = atomic_addresses(obj) if obj and obj != "???" else set()
                in_program = program is not None and same_file(obj, program)
            elif line.startswith("fn="):
                caller = resolve(line[3:], names)
            elif line.startswith("cfn="):
                callee = resolve(line[4:], names)
            elif line.startswith("calls="):
                skip_cost_line = True
                n = int(line[6:].split()[0])
                # One allocation is one count: operator new's own malloc is not another; one
                # clock read is one count: absl::Now's clock_gettime is not another.
                if (ALLOC.match(callee) and ALLOC.match(caller)) or (
                        CLOCK.match(callee) and CLOCK.match(caller)) or (
                        WAKE.match(callee) and WAKE.match(caller)):
                    continue
                if ALLOC.match(callee):
                    counts["allocs"] += n
                elif LOCK.match(callee):
                    counts["locks"] += n
                elif CLOCK.match(callee):
                    counts["clocks"] += n
                elif SYSCALL.match(callee):
                    counts["syscalls"] += n
                elif ENTRY.match(callee):
                    counts["entries"] += n
                elif WAKE.match(callee):
                    counts["wakes"] += n
            elif line.startswith("totals:") or line.startswith("summary:"):
                totals = int(line.split()[1])
    if totals is None:
        sys.exit(f"callgrind_counts.py: {path} has no totals line")
    return totals, counts


def resolve(rest, names, keep_version=False):
    """Names with string compression: "(id) name" defines, "(id)" refers."""
    rest = rest.strip()
    clean = (lambda name: name) if keep_version else strip_version
    m = re.match(r"^\((\d+)\)(?:\s+(.*))?$", rest)
    if not m:
        return clean(rest)
    if m.group(2) is not None:
        names[m.group(1)] = clean(m.group(2))
        return names[m.group(1)]
    return names.get(m.group(1), "")


def strip_version(name):
    """clock_gettime@@GLIBC_2.17 -> clock_gettime; C++ names keep their parentheses."""
    return name.split("@", 1)[0] if "(" not in name else name


def same_file(a, b):
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def program_of(path):
    """The counted program, from the dump's cmd: line (its first word)."""
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            if line.startswith("cmd:"):
                words = line[4:].split()
                return words[0] if words else None
            if line.startswith("fn="):
                break
    return None


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    calls = int(sys.argv[1])
    print("phase\tir\tallocs\tlocks\tclocks\tsyscalls\tatomics\tatomics_zrpc\tentries\twakes")
    for i, path in enumerate(sys.argv[2:], 1):
        program = program_of(path)
        totals, counts = read(path, program)
        print(f"{i}\t{totals / calls:.1f}\t"
              f"{counts['allocs'] / calls:.3f}\t{counts['locks'] / calls:.3f}\t"
              f"{counts['clocks'] / calls:.3f}\t{counts['syscalls'] / calls:.3f}\t"
              f"{counts['atomics'] / calls:.3f}\t{counts['atomics_zrpc'] / calls:.3f}\t"
              f"{counts['entries'] / calls:.3f}\t{counts['wakes'] / calls:.3f}")


if __name__ == "__main__":
    main()
