// Strict, exception-free access to yaml-cpp nodes for flatshard's spec readers:
// every accessor returns a Status whose message names the source, the line and
// the dotted field path. yaml-cpp throws; nothing here lets an exception escape.
#ifndef FLATSHARD_CORE_YAML_FIELDS_H_
#define FLATSHARD_CORE_YAML_FIELDS_H_

#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "yaml-cpp/yaml.h"

namespace flatshard {

// A node with its location, for error messages.
struct YamlField {
  YAML::Node node;
  std::string path;           // "root.children[2].in_features"
  const std::string* source;  // file name

  int line() const;
  absl::Status Error(absl::string_view problem) const;

  bool Has(absl::string_view key) const;
  YamlField Child(absl::string_view key) const;
  YamlField Element(size_t i) const;
  size_t size() const;

  absl::Status ExpectMap() const;
  absl::Status ExpectSequence() const;
  // Fails on a key not in `allowed`, listing what is.
  absl::Status OnlyKeys(std::initializer_list<absl::string_view> allowed,
                        const std::vector<absl::string_view>& also = {}) const;

  absl::StatusOr<std::string> AsString() const;
  absl::StatusOr<int64_t> AsInt() const;
  absl::StatusOr<double> AsDouble() const;
  absl::StatusOr<bool> AsBool() const;
};

// Parses a document; a syntax error names the source and the line.
absl::StatusOr<YAML::Node> ParseYamlDocument(absl::string_view text, const std::string& source);

}  // namespace flatshard

#endif  // FLATSHARD_CORE_YAML_FIELDS_H_
