# Sanitizer builds apply to all C++ in the tree so that races and overflows in
# any target (our code or a generated one) are reported. nvcc takes none of
# these flags; CUDA objects are built as usual and linked with the runtime.
set(_cxx "$<COMPILE_LANGUAGE:CXX>")
if(FLATSHARD_SANITIZER STREQUAL "ASAN")
  add_compile_options("$<${_cxx}:-fsanitize=address,undefined>" "$<${_cxx}:-fno-omit-frame-pointer>"
                      "$<${_cxx}:-fno-sanitize-recover=undefined>")
  add_link_options(-fsanitize=address,undefined)
elseif(FLATSHARD_SANITIZER STREQUAL "TSAN")
  add_compile_options("$<${_cxx}:-fsanitize=thread>" "$<${_cxx}:-fno-omit-frame-pointer>")
  add_link_options(-fsanitize=thread)
elseif(NOT FLATSHARD_SANITIZER STREQUAL "")
  message(FATAL_ERROR "FLATSHARD_SANITIZER must be empty, ASAN or TSAN, got '${FLATSHARD_SANITIZER}'")
endif()
