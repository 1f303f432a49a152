"""Exposes Debian's system libraries as Bazel targets, offline.

`system_libs(name = "system", libs = {...})` creates the repository `@system` with one
`cc_library` per entry. Each value is a space-separated list of pkg-config modules, or literal
linker flags when it starts with "-". Headers come from /usr/include, which the auto-configured
toolchain already searches and declares as a built-in include directory, so the targets carry
link flags only. A missing package is a clear error at fetch time naming tools/install-deps.
"""

def _pkg_config_libs(rctx, modules):
    pkg_config = rctx.which("pkg-config")
    if not pkg_config:
        fail("pkg-config not found: run tools/install-deps")
    res = rctx.execute([pkg_config, "--libs"] + modules.split(" "))
    if res.return_code != 0:
        fail("pkg-config --libs %s failed (%s): run tools/install-deps" %
             (modules, res.stderr.strip()))
    return res.stdout.strip().split(" ")

def _system_libs_impl(rctx):
    lines = ['package(default_visibility = ["//visibility:public"])', ""]
    for name in sorted(rctx.attr.libs.keys()):
        spec = rctx.attr.libs[name].strip()
        if spec == "":
            flags = []
        elif spec.startswith("-"):
            flags = spec.split(" ")
        else:
            flags = _pkg_config_libs(rctx, spec)
        lines.append("cc_library(name = %r, linkopts = %r)" % (name, [f for f in flags if f]))
    rctx.file("BUILD.bazel", "\n".join(lines) + "\n")
    rctx.file("WORKSPACE", "workspace(name = %r)\n" % rctx.name)

system_libs = repository_rule(
    implementation = _system_libs_impl,
    attrs = {"libs": attr.string_dict(mandatory = True)},
    environ = ["PKG_CONFIG_PATH"],
    local = True,
)
