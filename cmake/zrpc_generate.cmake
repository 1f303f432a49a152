# zrpc_generate(TARGET <target> [PROTOS <file>...] [IMPORT_DIRS <dir>...] [PROTOC_OUT_DIR <dir>])
#
# Compiles .proto files into <target>: protobuf's messages (.pb.h/.pb.cc) and zrpc's client stubs
# and service base classes (.zrpc.h/.zrpc.cc), both through CMake's protobuf_generate(). PROTOS
# defaults to the .proto files among the target's sources, which must lie in or below the
# current source directory: a file's import path, and so the path its generated headers are
# included by, is its path relative to that directory, as protoc and Bazel see it
# ("hello/greeter.proto" gives "hello/greeter.zrpc.h"). IMPORT_DIRS are where the .proto files
# they import may also lie; zrpc's own proto/zrpc/options.proto (bulk payloads) is always found.
# The target gets the output directory (PROTOC_OUT_DIR, the current binary directory by default)
# as a public include directory (in the build tree only: install generated headers yourself)
# and links zrpc::zrpc publicly. The generated files depend on the plugin too, so upgrading zrpc
# generates them again.
function(zrpc_generate)
  cmake_parse_arguments(arg "" "TARGET;PROTOC_OUT_DIR" "PROTOS;IMPORT_DIRS" ${ARGN})
  if(arg_UNPARSED_ARGUMENTS)
    message(FATAL_ERROR "zrpc_generate: unknown arguments: ${arg_UNPARSED_ARGUMENTS}")
  endif()
  if(NOT arg_TARGET OR NOT TARGET ${arg_TARGET})
    message(FATAL_ERROR "zrpc_generate: TARGET must name a target, got '${arg_TARGET}'")
  endif()
  set(protos ${arg_PROTOS})
  if(NOT protos)
    get_target_property(sources ${arg_TARGET} SOURCES)
    foreach(source IN LISTS sources)
      if(source MATCHES "\\.proto$")
        list(APPEND protos ${source})
      endif()
    endforeach()
  endif()
  if(NOT protos)
    message(FATAL_ERROR "zrpc_generate: no .proto file in PROTOS or among ${arg_TARGET}'s sources")
  endif()
  set(out ${arg_PROTOC_OUT_DIR})
  if(NOT out)
    set(out ${CMAKE_CURRENT_BINARY_DIR})
  endif()
  set(imports ${arg_IMPORT_DIRS} ${ZRPC_INCLUDE_DIR})
  protobuf_generate(LANGUAGE cpp PROTOS ${protos} IMPORT_DIRS ${imports} PROTOC_OUT_DIR ${out}
                    OUT_VAR messages)
  protobuf_generate(LANGUAGE zrpc PLUGIN protoc-gen-zrpc=${ZRPC_PLUGIN}
                    GENERATE_EXTENSIONS .zrpc.h .zrpc.cc PROTOS ${protos} IMPORT_DIRS ${imports}
                    PROTOC_OUT_DIR ${out} OUT_VAR services)
  # protobuf_generate() makes them depend on protoc and the .proto only.
  foreach(file IN LISTS services)
    if(file MATCHES "\\.zrpc\\.h$")  # the first output of its command
      add_custom_command(OUTPUT ${file} APPEND DEPENDS ${ZRPC_PLUGIN})
    endif()
  endforeach()
  target_sources(${arg_TARGET} PRIVATE ${messages} ${services})
  target_include_directories(${arg_TARGET} PUBLIC $<BUILD_INTERFACE:${out}>)
  target_link_libraries(${arg_TARGET} PUBLIC zrpc::zrpc)
endfunction()
