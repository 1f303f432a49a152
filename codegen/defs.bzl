"""zrpc_cc_library: C++ messages and zrpc services from .proto files, in one target.

    load("//codegen:defs.bzl", "zrpc_cc_library")

    zrpc_cc_library(
        name = "greeter",
        srcs = ["greeter.proto"],
        deps = ["//proto/common:types"],  # other zrpc_cc_library targets this one imports
    )

yields a cc_library `greeter` with greeter.pb.{h,cc} and greeter.zrpc.{h,cc}; include them as
"path/to/greeter.zrpc.h". It runs Debian's /usr/bin/protoc (whose built-in include path has the
well-known types, so `import "google/protobuf/empty.proto"` just works) with protoc-gen-zrpc.
.proto files are imported by their workspace-relative path.
"""

_ZrpcProtoInfo = provider(
    doc = "The .proto files of a zrpc_cc_library and of everything it imports.",
    fields = {"sources": "depset of .proto Files"},
)

_GEN_SUFFIX = "_zrpc_gen"
_PROTOC = "/usr/bin/protoc"

def _zrpc_gen_impl(ctx):
    sources = depset(ctx.files.srcs, transitive = [d[_ZrpcProtoInfo].sources for d in ctx.attr.deps])
    hdrs = []
    srcs = []
    for proto in ctx.files.srcs:
        if proto.owner.package != ctx.label.package:
            fail("%s: .proto files must be in the package of %s" % (proto.short_path, ctx.label))
        stem = proto.basename[:-len(".proto")]
        hdrs += [ctx.actions.declare_file(stem + ext) for ext in [".pb.h", ".zrpc.h"]]
        srcs += [ctx.actions.declare_file(stem + ext) for ext in [".pb.cc", ".zrpc.cc"]]

    # Protos are imported by workspace-relative path: the execution root is the import root.
    args = ctx.actions.args()
    args.add("--plugin=protoc-gen-zrpc=" + ctx.executable._plugin.path)
    args.add("--cpp_out=" + ctx.bin_dir.path)
    args.add("--zrpc_out=" + ctx.bin_dir.path)
    args.add("-I.")
    args.add_all(ctx.files.srcs)
    ctx.actions.run(
        executable = _PROTOC,
        arguments = [args],
        inputs = sources,
        tools = [ctx.executable._plugin],
        outputs = hdrs + srcs,
        mnemonic = "ZrpcProtoc",
        progress_message = "Generating messages and zrpc services for %s" % ctx.label,
    )
    return [
        DefaultInfo(files = depset(hdrs + srcs), runfiles = ctx.runfiles(files = hdrs + srcs)),
        OutputGroupInfo(hdrs = depset(hdrs), srcs = depset(srcs)),
        _ZrpcProtoInfo(sources = sources),
    ]

_zrpc_gen = rule(
    implementation = _zrpc_gen_impl,
    attrs = {
        "srcs": attr.label_list(allow_files = [".proto"], mandatory = True),
        "deps": attr.label_list(providers = [_ZrpcProtoInfo]),
        "_plugin": attr.label(
            default = Label("//codegen:protoc-gen-zrpc"),
            executable = True,
            cfg = "host",
        ),
    },
)

def _gen_label(dep):
    """The generator target behind the zrpc_cc_library `dep`."""
    if ":" in dep:
        return dep + _GEN_SUFFIX
    return "%s:%s%s" % (dep, dep.split("/")[-1], _GEN_SUFFIX)  # //a/b means //a/b:b

def zrpc_cc_library(name, srcs, deps = [], visibility = None, testonly = False, **kwargs):
    """C++ protobuf messages and zrpc services for `srcs`; `deps` are zrpc_cc_library targets."""
    _zrpc_gen(
        name = name + _GEN_SUFFIX,
        srcs = srcs,
        deps = [_gen_label(d) for d in deps],
        visibility = visibility,
        testonly = testonly,
    )
    for group in ["hdrs", "srcs"]:
        native.filegroup(
            name = "%s_%s%s" % (name, group, _GEN_SUFFIX),
            srcs = [":" + name + _GEN_SUFFIX],
            output_group = group,
            testonly = testonly,
        )
    native.cc_library(
        name = name,
        hdrs = [":%s_hdrs%s" % (name, _GEN_SUFFIX)],
        srcs = [":%s_srcs%s" % (name, _GEN_SUFFIX)],
        deps = deps + [
            Label("//rpc:generated_api"),
            Label("@system//:protobuf"),
        ],
        visibility = visibility,
        testonly = testonly,
        **kwargs
    )
