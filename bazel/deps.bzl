"""What a workspace needs before it can build zrpc, declared by one macro, offline.

zrpc's own WORKSPACE calls this, and so does a project that uses zrpc as an external repository
(README.md, "From your own workspace"):

    local_repository(name = "zrpc", path = "/path/to/zrpc")   # or any other repository rule
    load("@zrpc//bazel:deps.bzl", "zrpc_system_libs")
    zrpc_system_libs()

It declares @system, the Debian libraries (every one from a package that zrpc's
tools/install-deps installs), and, unless the workspace declared them first, in-tree stand-ins
for the three repositories Bazel 4.2.3 would otherwise download for any cc_test (rules_cc,
rules_java, remote_coverage_tools: bazel/stubs/README.md), so nothing is fetched from the network.
"""

load("//bazel:system_libs.bzl", "system_libs")

def _stub_repository_impl(rctx):
    # The stand-in's files, linked from zrpc's bazel/stubs/<name> (wherever zrpc itself lives).
    src = rctx.path(Label("//bazel:deps.bzl")).dirname.get_child("stubs").get_child(rctx.attr.stub)
    for entry in src.readdir():
        rctx.symlink(entry, entry.basename)

_stub_repository = repository_rule(
    implementation = _stub_repository_impl,
    attrs = {"stub": attr.string(mandatory = True)},
    local = True,
)

def zrpc_system_libs():
    """Declares @system (zrpc's BUILD files name it so) and the offline stand-ins."""
    for stub in ["rules_cc", "rules_java", "remote_coverage_tools"]:
        # A workspace with its own (say, downloaded) version keeps it.
        if not native.existing_rule(stub):
            _stub_repository(name = stub, stub = stub)
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
            "crypto": "libcrypto",  # OpenSSL's: HMAC-SHA256 and nonces, transport/auth.h
            "grpcpp": "grpc++",  # the gRPC baseline, benchmarks/grpc_bench only
            "ibverbs": "libibverbs",
            "protobuf": "protobuf",
            "protoc": "-lprotoc",  # Debian ships no pkg-config file for libprotoc
            "rdmacm": "librdmacm",
        },
    )
