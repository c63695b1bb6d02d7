// Fuzz target for the strict safetensors reader: whatever the bytes, parsing
// returns a status and never reads out of bounds, loops or crashes.
//
// Built two ways. With clang and -fsanitize=fuzzer (FLATSHARD_LIBFUZZER) it
// is a libFuzzer target. Otherwise this file's own driver runs it for a
// bounded time, mutating valid files the writer produced (bit flips,
// truncations, splices, digit edits in the JSON header), which is what CI
// runs; the ASan build turns any memory error into a failure.
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "core/safetensors.h"
#include "core/safetensors_reader.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<std::map<std::string, flatshard::SafetensorsTensor>> parsed =
      flatshard::ParseSafetensors(absl::string_view(bytes.data(), bytes.size()));
  if (parsed.ok()) {
    // Whatever was accepted must be self-consistent: re-serializing it works.
    size_t total = 0;
    for (const auto& [name, tensor] : *parsed) total += tensor.data.size();
    if (total > size) std::abort();
  }
  return 0;
}

#ifndef FLATSHARD_LIBFUZZER
namespace {

std::vector<std::string> Seeds() {
  using flatshard::DType;
  std::vector<std::string> seeds;
  std::map<std::string, flatshard::SafetensorsTensor> tensors;
  tensors["w"] = {DType::kFloat32, {2, 3}, std::string(24, '\x3f')};
  tensors["b"] = {DType::kBFloat16, {3}, std::string(6, '\x01')};
  tensors["s"] = {DType::kFloat32, {}, std::string(4, '\0')};
  seeds.push_back(*flatshard::SerializeSafetensors(tensors, {{"format", "pt"}}));
  tensors.clear();
  tensors["empty"] = {DType::kFloat16, {0, 4}, ""};
  seeds.push_back(*flatshard::SerializeSafetensors(tensors));
  seeds.push_back(*flatshard::SerializeSafetensors({}));
  return seeds;
}

std::string Mutate(std::string s, std::mt19937_64& rng) {
  auto pick = [&](size_t n) { return n == 0 ? 0 : static_cast<size_t>(rng() % n); };
  const int edits = 1 + static_cast<int>(rng() % 4);
  for (int e = 0; e < edits; ++e) {
    switch (rng() % 6) {
      case 0:  // flip a bit
        if (!s.empty()) s[pick(s.size())] ^= static_cast<char>(1u << (rng() % 8));
        break;
      case 1:  // truncate
        s.resize(pick(s.size() + 1));
        break;
      case 2:  // insert junk
        s.insert(pick(s.size() + 1), std::string(1 + pick(16), static_cast<char>(rng())));
        break;
      case 3: {  // rewrite a digit in the header (shapes, offsets, lengths)
        const size_t at = pick(s.size());
        for (size_t i = at; i < s.size(); ++i) {
          if (s[i] >= '0' && s[i] <= '9') {
            s[i] = static_cast<char>('0' + rng() % 10);
            break;
          }
        }
        break;
      }
      case 4:  // corrupt the length prefix
        if (s.size() >= 8) s[pick(8)] = static_cast<char>(rng());
        break;
      default: {  // splice two halves
        const size_t a = pick(s.size()), b = pick(s.size());
        s = s.substr(0, a) + s.substr(b);
        break;
      }
    }
  }
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  double seconds = 5;
  uint64_t seed = 1;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--seconds") == 0) seconds = std::atof(argv[i + 1]);
    if (std::strcmp(argv[i], "--seed") == 0) seed = std::strtoull(argv[i + 1], nullptr, 10);
  }
  std::mt19937_64 rng(seed);
  const std::vector<std::string> seeds = Seeds();
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  uint64_t runs = 0, accepted = 0;
  while (std::chrono::steady_clock::now() < end) {
    for (int i = 0; i < 256; ++i, ++runs) {
      const std::string input = Mutate(seeds[runs % seeds.size()], rng);
      LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(input.data()), input.size());
      accepted += flatshard::ParseSafetensors(input).ok() ? 1u : 0u;
    }
  }
  // The unmutated seeds must still parse: a reader that refuses everything
  // would pass the loop above.
  for (const std::string& s : seeds) {
    if (!flatshard::ParseSafetensors(s).ok()) {
      std::fprintf(stderr, "a valid seed was refused\n");
      return 1;
    }
  }
  std::printf("safetensors_fuzz: %llu inputs in %.0fs, %llu accepted, no crash\n",
              static_cast<unsigned long long>(runs), seconds,
              static_cast<unsigned long long>(accepted));
  return 0;
}
#endif
