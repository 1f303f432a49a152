"""Stand-in for @rules_java//java:defs.bzl: the native rules Bazel 4.2.3 already has."""

java_binary = native.java_binary
java_import = native.java_import
java_library = native.java_library
java_lite_proto_library = native.java_lite_proto_library
java_proto_library = native.java_proto_library
java_test = native.java_test
java_package_configuration = native.java_package_configuration
java_plugin = native.java_plugin
java_runtime = native.java_runtime
java_toolchain = native.java_toolchain
