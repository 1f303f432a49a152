"""opt_binary: a binary built with -c opt whatever the build's compilation mode.

Counts of instructions per call (benchmarks/count_instructions.sh) must describe the code users
run, which is optimized: a test in the default fastbuild would count -O0 code, whose costs are
distributed differently. The wrapped binary and everything it links are built again in opt mode
(once, then cached).
"""

def _to_opt_impl(settings, attr):
    return {"//command_line_option:compilation_mode": "opt"}

_to_opt = transition(
    implementation = _to_opt_impl,
    inputs = [],
    outputs = ["//command_line_option:compilation_mode"],
)

def _opt_binary_impl(ctx):
    info = ctx.attr.binary[0][DefaultInfo]
    out = ctx.actions.declare_file(ctx.label.name)
    ctx.actions.symlink(output = out, target_file = info.files_to_run.executable, is_executable = True)
    return [DefaultInfo(
        executable = out,
        files = depset([out]),
        runfiles = ctx.runfiles(files = [out]).merge(info.default_runfiles),
    )]

opt_binary = rule(
    implementation = _opt_binary_impl,
    attrs = {
        "binary": attr.label(mandatory = True, executable = True, cfg = _to_opt),
        "_allowlist_function_transition": attr.label(
            default = "@bazel_tools//tools/allowlists/function_transition_allowlist",
        ),
    },
    executable = True,
)
