"""recipes.py README DIR: README.md's blocks marked for files of DIR are in them, verbatim.

A block is a fenced block right after a line `<!-- recipe: tests/installed/<file> -->`; its lines
must be DIR/<file>'s, all of them, in order. A block must name each of the files CMakeLists.txt
and Makefile, so the README cannot drop a recipe unnoticed.
"""
import os
import re
import sys

readme, directory = sys.argv[1], sys.argv[2]
lines = open(readme).read().splitlines()
marker = re.compile(r"\s*<!-- recipe: tests/installed/(\S+) -->\s*$")
seen, failed = set(), 0
for i, line in enumerate(lines):
    m = marker.match(line)
    if not m:
        continue
    if i + 1 >= len(lines) or not lines[i + 1].lstrip().startswith("```"):
        sys.exit("README.md:%d: a recipe marker must be followed by a fenced block" % (i + 1))
    end = next((j for j in range(i + 2, len(lines)) if lines[j].lstrip().startswith("```")), None)
    if end is None:
        sys.exit("README.md:%d: the fenced block never ends" % (i + 2))
    block, name = lines[i + 2:end], m.group(1)
    seen.add(name)
    path = os.path.join(directory, name)
    have = open(path).read().splitlines() if os.path.exists(path) else []
    if block and have == block:
        print("ok   README.md:%d: %d lines, %s verbatim" % (i + 1, len(block), name))
    else:
        print("FAIL README.md:%d: %s is not this block, verbatim:" % (i + 1, name))
        print("\n".join("     | " + l for l in block))
        failed += 1
for name in ("CMakeLists.txt", "Makefile"):
    if name not in seen:
        print("FAIL README.md has no recipe block for tests/installed/%s" % name)
        failed += 1
sys.exit(1 if failed else 0)
