#!/usr/bin/env bash
# recipe_test.sh README WORKSPACE .bazelrc app/BUILD.bazel user.bazelrc
#
# README.md marks each block of its workspace recipe with a comment naming the file of this
# workspace that must hold it, `<!-- recipe: tests/consumer/<file> -->`, right before the fenced
# block. Each block, with "/path/to/zrpc" read as this workspace's path to zrpc ("../.."), must
# appear in that file as consecutive lines, verbatim. So CI builds exactly what users are told.
# The .bazelrc block must also be in zrpc's bazel/user.bazelrc, which the README offers to import.
set -euo pipefail
readme=$1
shift
exec python3 - "$readme" "$@" <<'PY'
import re, sys

readme, files = sys.argv[1], sys.argv[2:]
by_name = {}
for path in files:
    # Runfiles paths end with the file's path in this workspace (app/BUILD.bazel, .bazelrc, ...).
    by_name[path] = open(path).read().splitlines()

blocks = []  # (target file, lines)
lines = open(readme).read().splitlines()
i = 0
while i < len(lines):
    m = re.match(r"\s*<!-- recipe: tests/consumer/(\S+) -->\s*$", lines[i])
    if m:
        if i + 1 >= len(lines) or not lines[i + 1].lstrip().startswith("```"):
            sys.exit(f"README.md:{i + 1}: a recipe marker must be followed by a fenced block")
        j = i + 2
        while j < len(lines) and not lines[j].lstrip().startswith("```"):
            j += 1
        blocks.append((m.group(1), i + 1, lines[i + 2:j]))
        i = j
    i += 1

failed = 0
names = set()


def check(line, target, want):
    path = next((p for p in by_name if p == target or p.endswith("/" + target)), None)
    if path is None:
        print(f"FAIL README.md:{line}: block for {target}, which this test was not given")
        return 1
    have = by_name[path]
    found = any(have[k:k + len(want)] == want for k in range(len(have) - len(want) + 1))
    if found and want:
        print(f"ok   README.md:{line}: {len(want)} lines found verbatim in {target}")
        return 0
    print(f"FAIL README.md:{line}: {target} does not contain these {len(want)} lines:")
    print("\n".join("     | " + l for l in want))
    return 1


for target, line, block in blocks:
    names.add(target)
    failed += check(line, target, [l.replace("/path/to/zrpc", "../..") for l in block])
    if target == ".bazelrc":
        # zrpc's bazel/user.bazelrc: the same flags, nothing more (its comments aside).
        path = next((p for p in by_name if p.endswith("bazel/user.bazelrc")), None)
        flags = [] if path is None else [
            l for l in by_name[path] if l.strip() and not l.lstrip().startswith("#")]
        if path is None:
            print(f"FAIL README.md:{line}: zrpc's bazel/user.bazelrc was not given to this test")
            failed += 1
        elif flags == block:
            print(f"ok   README.md:{line}: bazel/user.bazelrc holds the same {len(flags)} lines")
        else:
            print(f"FAIL README.md:{line}: bazel/user.bazelrc's flags differ from the block:")
            print("\n".join("     | " + l for l in flags))
            failed += 1

expected = {"WORKSPACE", ".bazelrc", "app/BUILD.bazel"}
for missing in sorted(expected - names):
    print(f"FAIL README.md has no recipe block for tests/consumer/{missing}")
    failed += 1
sys.exit(1 if failed else 0)
PY
