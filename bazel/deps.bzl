"""What a workspace needs before it can build zrpc: the Debian libraries as @system.

zrpc's own WORKSPACE calls this, and so does a project that uses zrpc as an external repository:

    local_repository(name = "zrpc", path = "/path/to/zrpc")   # or any other repository rule
    load("@zrpc//bazel:deps.bzl", "zrpc_system_libs")
    zrpc_system_libs()

Every library comes from a Debian package that zrpc's tools/install-deps installs.
"""

load("//bazel:system_libs.bzl", "system_libs")

def zrpc_system_libs():
    """Declares @system (zrpc's BUILD files name it so), one cc_library per system library."""
    system_libs(
        name = "system",
        libs = {
            "absl": " ".join([
                "absl_status",
                "absl_statusor",
                "absl_strings",
                "absl_str_format",
                "absl_synchronization",
                "absl_time",
                "absl_raw_hash_set",
                "absl_hash",
            ]),
            "benchmark": "benchmark",
            "catch2": "",  # header-only: /usr/include/catch2/catch.hpp
            "grpcpp": "grpc++",  # the gRPC baseline, benchmarks/grpc_bench only
            "ibverbs": "libibverbs",
            "protobuf": "protobuf",
            "protoc": "-lprotoc",  # Debian ships no pkg-config file for libprotoc
            "rdmacm": "librdmacm",
        },
    )
