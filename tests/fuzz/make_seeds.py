#!/usr/bin/env python3
"""Writes the seed corpora of the fuzz targets into tests/fuzz/corpus/TARGET/.

Seeds are small valid inputs and the edge cases around each rule, so that a short fuzz run starts
next to every branch instead of having to find the magic number or a valid call id first. The
layouts follow transport/wire.h, rpc/WIRE.md and the input formats described at the top of each
tests/fuzz/*_fuzz.cc. Deterministic: rerunning rewrites the same files. Inputs that
`tools/fuzz merge` added (named by their SHA-1) are left alone.

Usage: tests/fuzz/make_seeds.py
"""
import os
import struct

CORPUS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus")

WIRE_MAGIC = 0x5A525043
ARENA_ALIGN = 64
MAX_ARENA = 1 << 30
MAX_ERROR_MESSAGE = 1024
U64_MAX = (1 << 64) - 1


WIRE_VERSION = 11  # transport::kWireVersion


def hello(magic=WIRE_MAGIC, version=WIRE_VERSION, flags=0, credits=64, recv_size=4096,
          addr=0x7F0000001000, rkey=0x1234, arena=1 << 20, max_credits=None):
    max_credits = credits if max_credits is None else max_credits
    return struct.pack("<IHHIIQIII", magic, version, flags, credits, recv_size, addr, rkey, arena,
                       max_credits)


def hello_seeds():
    valid = hello()
    return {
        "valid_typical": valid,
        "valid_elastic": hello(credits=3, max_credits=32),
        "valid_lower_bounds": hello(credits=3, recv_size=8, addr=0, rkey=0, arena=0),
        # The last arena that ends inside the address space, the largest window and RECV.
        "valid_upper_bounds": hello(credits=65535, recv_size=0xFFFFFFFF,
                                    addr=U64_MAX - MAX_ARENA, arena=MAX_ARENA),
        "valid_no_arena_any_addr": hello(addr=U64_MAX, arena=0),
        "valid_with_later_fields": valid + bytes(range(20)),  # 56 bytes, the CM's limit
        "empty": b"",
        "short_magic_only": valid[:3],
        "truncated_35": valid[:35],
        "wrong_magic": hello(magic=0x43505A52),
        "version_4": hello(version=4)[:32],  # a peer of the wire before elastic windows
        "version_6": hello(version=6),
        "version_7": hello(version=7),  # before authentication
        "version_9": hello(version=9),  # before metadata
        "auth_provisional": hello(flags=4, credits=1, addr=0, rkey=0),
        "auth_credits_2": hello(flags=4, credits=2, addr=0, rkey=0),
        "auth_with_key": hello(flags=4, addr=0),
        "flags_8": hello(flags=8),
        "flags_set": hello(flags=1),
        "credits_2": hello(credits=2),
        "credits_65536": hello(credits=65536),
        "max_below_credits": hello(credits=8, max_credits=7),
        "max_65536": hello(credits=8, max_credits=65536),
        "recv_size_7": hello(recv_size=7),
        "arena_unaligned": hello(arena=(1 << 20) + 1),
        "arena_too_big": hello(arena=MAX_ARENA + ARENA_ALIGN),
        "arena_ends_at_2_64": hello(addr=(1 << 64) - MAX_ARENA, arena=MAX_ARENA),
    }


def frame(released=0, credits=0, kind=1, reserved=0):
    return struct.pack("<IHBB", released, credits, kind, reserved)


def frame_header_seeds():
    return {
        "data_no_payload": frame(),
        "data_with_payload": frame(released=4096, credits=3) + b"payload!" * 4,
        "credit_update": frame(released=12345, credits=5, kind=2),
        "all_ones": frame(released=0xFFFFFFFF, credits=0xFFFF, kind=1),
        "credit_with_payload": frame(kind=2) + b"x",
        "kind_0": frame(kind=0),
        "kind_3": frame(kind=3),
        "auth": frame(kind=6) + bytes(44),
        "auth_short": frame(kind=6) + bytes(43),
        "auth_ok": frame(credits=32, kind=7) + bytes(28),
        "auth_ok_long": frame(kind=7) + bytes(29),
        "kind_8": frame(kind=8),
        "reserved_set": frame(reserved=1),
        "short_7": frame()[:7],
    }


def fnv1a32(text):
    h = 2166136261
    for b in text.encode():
        h = ((h ^ b) * 16777619) & 0xFFFFFFFF
    return h


def rpc(kind, flags=0, method=0, service=0, call_id=1, timeout=0, bulk=0, status=0, window=0):
    return struct.pack("<BBHIQQIHH", kind, flags, method, service, call_id, timeout, bulk,
                       status, window)


REQ, RESP, ERR, CANCEL, PULLED = 1, 2, 3, 4, 5
STREAM_MESSAGE, HALF_CLOSE, CREDIT = 6, 7, 8


def rpc_header_seeds():
    greeter = fnv1a32("zrpc.examples.Greeter")
    return {
        "request": rpc(REQ, method=1, service=greeter, call_id=0x100000001,
                       timeout=1000000) + b"\x0a\x05world",
        "request_no_deadline": rpc(REQ, service=greeter, call_id=7),
        "request_bulk": rpc(REQ, flags=1, service=greeter, call_id=2, bulk=4096),
        "request_max_fields": rpc(REQ, flags=1, method=0xFFFF, service=0xFFFFFFFF,
                                  call_id=U64_MAX, timeout=U64_MAX, bulk=0xFFFFFFFF),
        "response": rpc(RESP, call_id=3) + b"\x0a\x0bhello world",
        "response_bulk": rpc(RESP, flags=1, call_id=3, bulk=1 << 20),
        "error": rpc(ERR, call_id=4, status=5) + b"no such object",
        "error_unauthenticated": rpc(ERR, call_id=4, status=16),
        "error_body_at_limit": rpc(ERR, call_id=4, status=13) + b"e" * MAX_ERROR_MESSAGE,
        "error_body_past_limit": rpc(ERR, call_id=4, status=13) + b"e" * (MAX_ERROR_MESSAGE + 1),
        "error_status_ok": rpc(ERR, call_id=4),
        "error_status_17": rpc(ERR, call_id=4, status=17),
        "error_with_bulk": rpc(ERR, flags=1, call_id=4, status=2, bulk=64),
        "cancel": rpc(CANCEL, call_id=5),
        "cancel_with_body": rpc(CANCEL, call_id=5) + b"?",
        "call_id_0": rpc(RESP, call_id=0),
        "kind_0": rpc(0),
        "pulled": rpc(PULLED, call_id=5),
        "pulled_with_body": rpc(PULLED, call_id=5) + b"?",
        # Streams (wire version 4): an open carries a window, as does a credit.
        "stream_open": rpc(REQ, flags=0x10, service=greeter, call_id=9, window=16),
        "stream_open_without_window": rpc(REQ, flags=0x10, service=greeter, call_id=9),
        "stream_open_large_body": rpc(REQ, flags=0x19, service=greeter, call_id=9, bulk=5000,
                                      window=1) + struct.pack("<II", 5000, 0),
        "stream_message": rpc(STREAM_MESSAGE, call_id=9) + b"\x08\x01",
        "stream_message_large_body": rpc(STREAM_MESSAGE, flags=9, call_id=9, bulk=8192)
        + struct.pack("<II", 8192, 0),
        "stream_message_with_window": rpc(STREAM_MESSAGE, call_id=9, window=1),
        "half_close": rpc(HALF_CLOSE, call_id=9),
        "half_close_with_body": rpc(HALF_CLOSE, call_id=9) + b"?",
        "credit": rpc(CREDIT, call_id=9, window=0xFFFF),
        "credit_of_0": rpc(CREDIT, call_id=9),
        "window_in_request": rpc(REQ, service=greeter, window=1),
        "kind_9": rpc(9),
        "unknown_flag": rpc(REQ, flags=0x40, service=greeter),
        # Wire version 10: a metadata block (size, entries) in front of the body.
        "request_metadata": rpc(REQ, flags=0x20, service=greeter, call_id=2)
        + struct.pack("<I", 10) + b"\x00\x01\x05\x00kvalue" + b"\x0a\x01x",
        "request_metadata_large_body": rpc(REQ, flags=0x29, service=greeter, call_id=2, bulk=5000)
        + struct.pack("<I", 6) + b"\x00\x01\x01\x00kv" + struct.pack("<II", 5000, 0),
        "request_metadata_empty_block": rpc(REQ, flags=0x20, service=greeter, call_id=2)
        + struct.pack("<I", 0),
        "error_metadata_payload": rpc(ERR, flags=0x20, call_id=4, status=5)
        + struct.pack("<I", 9) + b"\x01\x03\x02\x00t/xab" + b"not found",
        "stream_message_metadata": rpc(STREAM_MESSAGE, flags=0x20, call_id=9)
        + struct.pack("<I", 6) + b"\x00\x01\x01\x00kv",
        # A large body: the trailer (size, reserved), then descriptors when pulled.
        "request_large_body": rpc(REQ, flags=9, service=greeter, call_id=2, bulk=5000)
        + struct.pack("<II", 5000, 0),
        "response_large_body_with_bulk_pulled": rpc(RESP, flags=0xB, call_id=3, bulk=1 << 20)
        + struct.pack("<II", 5000, 0) + b"d" * 12 + b"\0" * 4 + b"e" * 12 + b"\0" * 4,
        "large_body_one_descriptor_short": rpc(RESP, flags=0xB, call_id=3, bulk=1 << 20)
        + struct.pack("<II", 5000, 0) + b"d" * 12 + b"\0" * 4,
        "large_body_past_payload": rpc(REQ, flags=9, service=greeter, call_id=2, bulk=10)
        + struct.pack("<II", 11, 0),
        "large_body_without_bulk": rpc(REQ, flags=8, service=greeter, call_id=2)
        + struct.pack("<II", 1, 0),
        "request_pull": rpc(REQ, flags=3, service=greeter, call_id=2, bulk=1 << 30) + b"d" * 16,
        # Wire version 9: a descriptor's flags are 0 or kPullWindow (1), the same on both.
        "response_pull_window": rpc(RESP, flags=3, call_id=3, bulk=1 << 20)
        + struct.pack("<QII", 0x1000, 0x1234, 1),
        "response_pull_flag_2": rpc(RESP, flags=3, call_id=3, bulk=1 << 20)
        + struct.pack("<QII", 0x1000, 0x1234, 2),
        "large_body_windows": rpc(RESP, flags=0xB, call_id=3, bulk=1 << 20)
        + struct.pack("<II", 5000, 0) + struct.pack("<QII", 0x1000, 0x1234, 1) * 2,
        "large_body_windows_differ": rpc(RESP, flags=0xB, call_id=3, bulk=1 << 20)
        + struct.pack("<II", 5000, 0) + struct.pack("<QII", 0x1000, 0x1234, 1)
        + struct.pack("<QII", 0x2000, 0x5678, 0),
        "response_pull_short_body": rpc(RESP, flags=3, call_id=3, bulk=1 << 20) + b"d" * 15,
        "pull_without_bulk": rpc(RESP, flags=2, call_id=3) + b"d" * 16,
        "request_pull_response": rpc(REQ, flags=4, service=greeter, call_id=2),
        "pull_response_in_response": rpc(RESP, flags=4, call_id=3),
        "window_in_response": rpc(RESP, window=1),
        "status_in_request": rpc(REQ, service=greeter, status=1),
        "service_in_response": rpc(RESP, service=greeter),
        "timeout_in_cancel": rpc(CANCEL, timeout=10),
        "bulk_flag_without_size": rpc(REQ, flags=1, service=greeter),
        "bulk_size_without_flag": rpc(RESP, bulk=64),
        "short_31": rpc(RESP)[:31],
    }


def error_body(message, code=13, selector=0, limit=MAX_ERROR_MESSAGE):
    return struct.pack("<HBQ", code, selector, limit) + message


def error_body_seeds():
    e_acute = "\u00e9".encode()  # 2 bytes
    snowman = "\u2603".encode()  # 3 bytes
    emoji = "\U0001F600".encode()  # 4 bytes
    return {
        "short_message": error_body(b"no such object", code=5),
        "empty_message": error_body(b""),
        "at_limit": error_body(b"a" * MAX_ERROR_MESSAGE),
        "past_limit": error_body(b"a" * (MAX_ERROR_MESSAGE + 1)),
        "utf8_2byte_cut": error_body(e_acute * 600),
        "utf8_3byte_cut": error_body(snowman * 400),
        "utf8_4byte_cut": error_body(emoji * 300, limit=100),
        "limit_below_marker": error_body(b"a long message", limit=5),
        "limit_0": error_body(b"anything", limit=0),
        "limit_max": error_body(b"b" * 1100, limit=U64_MAX),
        "continuation_run": error_body(b"x" + b"\x80" * 40, limit=20),
        "not_an_error": error_body(b"body", selector=0x80 | 2),
        "status_ok": error_body(b"body", code=0),
        "status_17": error_body(b"body", code=17),
        "status_ffff": error_body(b"body", code=0xFFFF),
        "truncated_prefix": b"\x05\x00\x00",
    }


# Arena programs (arena_fuzz.cc): byte 0 = arena size / 64, then opcodes and operands.
ARRIVE, WRITE, RELEASE, RELEASE_ANY, REPORT, CLAIM = range(6)
RESTART = 1 << 31


def arrive(imm, length):
    return struct.pack("<BII", ARRIVE, imm, length)


def write(length):
    return struct.pack("<BH", WRITE, length)


def release(k=0):
    return struct.pack("<BB", RELEASE, k)


def release_any(sequence):
    return struct.pack("<BQ", RELEASE_ANY, sequence)


def report():
    return bytes([REPORT])


def claim(total):
    return struct.pack("<BI", CLAIM, total)


def program(units, *ops):
    return bytes([units]) + b"".join(ops)


def arena_seeds():
    return {
        # 4 KiB: back to back, cache-line aligned, released out of order.
        "honest_back_to_back": program(64, write(1), write(64), write(65), release(1), release(0),
                                       report(), release(0), report()),
        # 1 KiB: the third payload does not fit before the end and wraps to offset 0.
        "honest_wrap_with_padding": program(16, write(512), write(256), release(0), report(),
                                            write(384), release(0), release(0), report()),
        # A payload as large as the arena, twice: the second needs the restart bit.
        "honest_full_arena_restart": program(16, write(1024), release(0), report(), write(1024),
                                             release(0), report()),
        "honest_wait_for_space": program(4, write(200), write(100), release(0), write(100),
                                         report(), write(100)),
        "peer_wrong_offset": program(64, arrive(64, 10)),
        "peer_restart_while_held": program(64, write(100), arrive(RESTART, 64)),
        "peer_restart_when_empty": program(64, write(100), release(0), arrive(RESTART | 0, 4096)),
        "peer_oversize": program(64, arrive(0, 4097)),
        "peer_length_near_2_32": program(64, arrive(0, 0xFFFFFFFF)),
        "peer_empty_write": program(64, arrive(0, 0)),
        "peer_reserved_bit_30": program(64, arrive(1 << 30, 64)),
        "peer_overfill": program(2, arrive(0, 64), arrive(64, 64), arrive(0, 64)),
        "release_twice_and_never": program(8, write(64), release(0), release(0), release(5),
                                           release_any(1 << 63)),
        "claim_more_than_used": program(8, write(128), claim(256), claim(64), report()),
        "no_arena": program(0, write(1), arrive(0, 1), report()),
    }


def main():
    for target, seeds in (("hello", hello_seeds()), ("frame_header", frame_header_seeds()),
                          ("rpc_header", rpc_header_seeds()), ("error_body", error_body_seeds()),
                          ("arena", arena_seeds())):
        directory = os.path.join(CORPUS, target)
        os.makedirs(directory, exist_ok=True)
        for name, data in seeds.items():
            with open(os.path.join(directory, name), "wb") as f:
                f.write(data)
        print("%s: %d seeds" % (target, len(seeds)))


if __name__ == "__main__":
    main()
