// Where tests find the repository's files (examples/, tests/data/).
#ifndef FLATSHARD_TESTS_UNIT_CORE_TEST_PATHS_H_
#define FLATSHARD_TESTS_UNIT_CORE_TEST_PATHS_H_

#include <string>

namespace flatshard::testing_paths {

inline std::string SourceDir() { return FLATSHARD_SOURCE_DIR; }
inline std::string Example(const std::string& name) { return SourceDir() + "/examples/" + name; }

}  // namespace flatshard::testing_paths

#endif  // FLATSHARD_TESTS_UNIT_CORE_TEST_PATHS_H_
