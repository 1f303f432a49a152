#!/bin/sh
echo "coverage is not available offline (Bazel's coverage tools are not packaged)" >&2
exit 1
