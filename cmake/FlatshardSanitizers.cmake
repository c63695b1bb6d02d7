# Sanitizer builds apply to everything in the tree so that races and overflows in
# any target (our code or a generated one) are reported.
if(FLATSHARD_SANITIZER STREQUAL "ASAN")
  add_compile_options(-fsanitize=address,undefined -fno-omit-frame-pointer
                      -fno-sanitize-recover=undefined)
  add_link_options(-fsanitize=address,undefined)
elseif(FLATSHARD_SANITIZER STREQUAL "TSAN")
  add_compile_options(-fsanitize=thread -fno-omit-frame-pointer)
  add_link_options(-fsanitize=thread)
elseif(NOT FLATSHARD_SANITIZER STREQUAL "")
  message(FATAL_ERROR "FLATSHARD_SANITIZER must be empty, ASAN or TSAN, got '${FLATSHARD_SANITIZER}'")
endif()
