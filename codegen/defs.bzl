"""zrpc_cc_library: C++ messages and zrpc services from .proto files, in one target.

    load("//codegen:defs.bzl", "zrpc_cc_library")      # "@zrpc//codegen:defs.bzl" from outside

    zrpc_cc_library(
        name = "greeter",
        srcs = ["greeter.proto"],
        deps = ["//proto/common:types"],  # other zrpc_cc_library targets this one imports
    )

yields a cc_library `greeter` with greeter.pb.{h,cc} and greeter.zrpc.{h,cc}; include them as
"path/to/greeter.zrpc.h". It runs Debian's /usr/bin/protoc (whose built-in include path has the
well-known types, so `import "google/protobuf/empty.proto"` just works) with protoc-gen-zrpc.

Import paths are relative to the root of the repository a .proto lives in, in the main workspace
and in external ones alike: a file at @shared//api/v1/store.proto is imported as
"api/v1/store.proto" and its headers are included as "api/v1/store.zrpc.h". zrpc's own options
(proto/zrpc/options.proto, for bulk methods) are imported as "proto/zrpc/options.proto" and need
no entry in `deps` (except with services = False). In a package with a part named zrpc, refer to
the option as (.zrpc.method): protobuf resolves option names relative to the package first.
"""

_ZrpcProtoInfo = provider(
    doc = "The .proto files of a zrpc_cc_library and of everything it imports.",
    fields = {"sources": "depset of .proto Files"},
)

_GEN_SUFFIX = "_zrpc_gen"
_PROTOC = "/usr/bin/protoc"
_OPTIONS = "//proto/zrpc:options"

def _import_roots(sources):
    """The -I flags that give every .proto its repository-relative import path.

    External repositories come first: the execution root (".") also contains
    external/<repo>/x.proto, and protoc takes the first root a file lies under.
    """
    roots = {}
    for f in sources.to_list():
        if f.owner.workspace_root:
            roots[f.owner.workspace_root] = True
    return ["-I" + root for root in sorted(roots.keys())] + ["-I."]

def _zrpc_gen_impl(ctx):
    sources = depset(ctx.files.srcs, transitive = [d[_ZrpcProtoInfo].sources for d in ctx.attr.deps])
    services = hasattr(ctx.executable, "_plugin")
    kinds = [".pb"] + ([".zrpc"] if services else [])
    hdrs = []
    srcs = []
    for proto in ctx.files.srcs:
        if not proto.is_source:
            fail("%s: generated .proto files are not supported; check the file in" % proto.owner)
        if (proto.owner.workspace_name != ctx.label.workspace_name or
            proto.owner.package != ctx.label.package):
            fail("%s: .proto files must be in the package of %s" % (proto.owner, ctx.label))
        stem = proto.basename[:-len(".proto")]
        hdrs += [ctx.actions.declare_file(stem + kind + ".h") for kind in kinds]
        srcs += [ctx.actions.declare_file(stem + kind + ".cc") for kind in kinds]

    # protoc writes each output at its import path below the out directory, so for a target in
    # an external repository that directory is the repository's own output root.
    out = ctx.bin_dir.path
    if ctx.label.workspace_root:
        out += "/" + ctx.label.workspace_root
    args = ctx.actions.args()
    args.add("--cpp_out=" + out)
    tools = []
    if services:
        args.add("--plugin=protoc-gen-zrpc=" + ctx.executable._plugin.path)
        args.add("--zrpc_out=" + out)
        tools.append(ctx.executable._plugin)
    args.add_all(_import_roots(sources))
    args.add_all(ctx.files.srcs)
    ctx.actions.run(
        executable = _PROTOC,
        arguments = [args],
        inputs = sources,
        tools = tools,
        outputs = hdrs + srcs,
        mnemonic = "ZrpcProtoc",
        progress_message = "Generating C++ for %s" % ctx.label,
    )
    return [
        DefaultInfo(files = depset(hdrs + srcs), runfiles = ctx.runfiles(files = hdrs + srcs)),
        OutputGroupInfo(hdrs = depset(hdrs), srcs = depset(srcs)),
        _ZrpcProtoInfo(sources = sources),
    ]

_ATTRS = {
    "srcs": attr.label_list(allow_files = [".proto"], mandatory = True),
    "deps": attr.label_list(providers = [_ZrpcProtoInfo]),
}

_zrpc_gen = rule(
    implementation = _zrpc_gen_impl,
    attrs = dict(_ATTRS, _plugin = attr.label(
        default = Label("//codegen:protoc-gen-zrpc"),
        executable = True,
        cfg = "host",
    )),
)

# Messages only, for the protos the plugin itself links (proto/zrpc/options.proto).
_messages_gen = rule(implementation = _zrpc_gen_impl, attrs = _ATTRS)

def _gen_label(dep):
    """The generator target behind the zrpc_cc_library `dep` (a label string or a Label)."""
    if type(dep) != "string":
        return Label("%s//%s:%s%s" % ("@" + dep.workspace_name, dep.package, dep.name, _GEN_SUFFIX))
    if dep.startswith("@") and "//" not in dep:
        return "%s//:%s%s" % (dep, dep[1:], _GEN_SUFFIX)  # @repo means @repo//:repo
    if ":" in dep:
        return dep + _GEN_SUFFIX
    return "%s:%s%s" % (dep, dep.split("/")[-1], _GEN_SUFFIX)  # //a/b means //a/b:b

def _is_options(dep):
    return str(dep).endswith(_OPTIONS)

def zrpc_cc_library(name, srcs, deps = [], services = True, visibility = None, testonly = False,
                    **kwargs):
    """C++ protobuf messages and zrpc services for `srcs`; `deps` are zrpc_cc_library targets.

    With services = False only the messages are generated (the .pb files, no zrpc runtime).
    """
    cc_deps = list(deps)
    gen_deps = [_gen_label(d) for d in deps]
    if services:
        cc_deps.append(Label("//rpc:generated_api"))
        if not [d for d in deps if _is_options(d)]:
            cc_deps.append(Label(_OPTIONS))
            gen_deps.append(Label(_OPTIONS + _GEN_SUFFIX))
    (_zrpc_gen if services else _messages_gen)(
        name = name + _GEN_SUFFIX,
        srcs = srcs,
        deps = gen_deps,
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
        deps = cc_deps + [Label("@system//:protobuf")],
        visibility = visibility,
        testonly = testonly,
        **kwargs
    )
