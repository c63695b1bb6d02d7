# Warnings for flatshard's own targets (generated and third-party code is exempt).
add_library(flatshard_warnings INTERFACE)
target_compile_options(flatshard_warnings INTERFACE
  $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wpedantic -Wshadow -Wnon-virtual-dtor
    -Wold-style-cast -Wcast-align -Woverloaded-virtual -Wconversion -Wsign-conversion
    -Wimplicit-fallthrough>)
if(FLATSHARD_WERROR)
  target_compile_options(flatshard_warnings INTERFACE $<$<COMPILE_LANGUAGE:CXX>:-Werror>)
endif()
