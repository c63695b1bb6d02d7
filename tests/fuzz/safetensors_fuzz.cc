// Fuzz target for the strict safetensors reader: whatever the bytes, parsing
// returns a status and never reads out of bounds, loops or crashes, and what it
// accepts is self-consistent: its tensors fit in the input and writing them
// back gives a file that parses to the same tensors. Seeds (corpus/safetensors)
// are files the writer produced; fuzz_driver.h explains the two builds.
#include <map>
#include <string>
#include <vector>

#include "core/safetensors.h"
#include "storage/safetensors_reader.h"
#include "tests/fuzz/fuzz_driver.h"

namespace flatshard::fuzz {
namespace {

using Tensors = std::map<std::string, SafetensorsTensor>;

bool SameTensors(const Tensors& a, const Tensors& b) {
  if (a.size() != b.size()) return false;
  for (auto ai = a.begin(), bi = b.begin(); ai != a.end(); ++ai, ++bi) {
    if (ai->first != bi->first || ai->second.dtype != bi->second.dtype ||
        ai->second.shape != bi->second.shape || ai->second.data != bi->second.data) {
      return false;
    }
  }
  return true;
}

}  // namespace

bool FuzzOneInput(absl::string_view input) {
  std::map<std::string, std::string> metadata;
  absl::StatusOr<Tensors> parsed = ParseSafetensors(input, &metadata);
  if (!parsed.ok()) return false;
  size_t total = 0;
  for (const auto& [name, tensor] : *parsed) total += tensor.data.size();
  FUZZ_CHECK(total <= input.size(), "accepted tensors hold more bytes than the file");
  absl::StatusOr<std::string> written = SerializeSafetensors(*parsed, metadata);
  FUZZ_CHECK(written.ok(), written.status().ToString());
  std::map<std::string, std::string> reread_metadata;
  absl::StatusOr<Tensors> reread = ParseSafetensors(*written, &reread_metadata);
  FUZZ_CHECK(reread.ok(), reread.status().ToString());
  FUZZ_CHECK(SameTensors(*parsed, *reread), "rewritten tensors differ from the accepted ones");
  FUZZ_CHECK(metadata == reread_metadata, "rewritten metadata differs from the accepted one");
  return true;
}

std::vector<Seed> GeneratedSeeds(const std::vector<Seed>& /*corpus*/) {
  std::vector<Seed> seeds;
  Tensors tensors;
  tensors["w"] = {DType::kFloat32, {2, 3}, std::string(24, '\x3f')};
  tensors["b"] = {DType::kBFloat16, {3}, std::string(6, '\x01')};
  tensors["s"] = {DType::kFloat32, {}, std::string(4, '\0')};
  seeds.push_back(
      {"three-tensors.safetensors", *SerializeSafetensors(tensors, {{"format", "pt"}})});
  tensors.clear();
  tensors["empty"] = {DType::kFloat16, {0, 4}, ""};
  seeds.push_back({"empty-tensor.safetensors", *SerializeSafetensors(tensors)});
  seeds.push_back({"no-tensors.safetensors", *SerializeSafetensors({})});
  return seeds;
}

}  // namespace flatshard::fuzz
