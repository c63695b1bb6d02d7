#include "storage/checkpoint_manifest.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <set>
#include <tuple>
#include <utility>

#include <xxhash.h>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "google/protobuf/util/json_util.h"
#include "nlohmann/json.hpp"

#include "core/status_macros.h"
#include "storage/durable_file.h"

namespace flatshard {
namespace {

using Json = nlohmann::ordered_json;

// Field access that reports which field of which file is wrong instead of
// throwing.
class Fields {
 public:
  Fields(const Json& json, std::string what) : json_(json), what_(std::move(what)) {}

  template <typename T>
  absl::Status Get(const char* key, T& out) const {
    if (!json_.contains(key)) return Missing(key);
    try {
      out = json_.at(key).get<T>();
    } catch (const nlohmann::json::exception&) {
      return absl::InvalidArgumentError(
          absl::StrCat(what_, ": field '", key, "' has the wrong type: ", json_.at(key).dump()));
    }
    return absl::OkStatus();
  }
  absl::Status Missing(const char* key) const {
    return absl::InvalidArgumentError(absl::StrCat(what_, ": missing field '", key, "'"));
  }
  const Json& json() const { return json_; }
  const std::string& what() const { return what_; }

 private:
  const Json& json_;
  std::string what_;
};

#define FS_FIELD(fields, key, out)                        \
  do {                                                    \
    absl::Status fs_status_ = (fields).Get((key), (out)); \
    if (!fs_status_.ok()) return fs_status_;              \
  } while (false)

}  // namespace

absl::Status CheckFileRegions(const std::vector<CheckpointFile>& files, absl::string_view what) {
  std::map<std::string, std::vector<const CheckpointFile*>> by_name;
  for (const CheckpointFile& f : files) by_name[f.name].push_back(&f);
  for (const auto& file : by_name) {
    const std::string& name = file.first;  // a plain name: lambdas may not capture bindings
    const std::vector<const CheckpointFile*>& entries = file.second;
    auto bad = [&](absl::string_view why) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": files['", name, "'] ", why));
    };
    const uint64_t size = entries.front()->bytes;
    std::vector<FileRegion> ranges;
    for (const CheckpointFile* f : entries) {
      if (f->bytes != size) {
        return bad(absl::StrCat("is listed with sizes ", size, " and ", f->bytes));
      }
      if (f->regions.empty()) {
        if (entries.size() > 1) {
          return bad(absl::StrCat("is listed ", entries.size(), " times, rank ", f->rank,
                                  "'s entry without the regions it wrote"));
        }
        continue;  // one writer, the whole file
      }
      for (size_t i = 1; i < f->regions.size(); ++i) {
        if (f->regions[i].offset <= f->regions[i - 1].offset) {
          return bad(absl::StrCat("lists rank ", f->rank, "'s regions out of file order"));
        }
      }
      ranges.insert(ranges.end(), f->regions.begin(), f->regions.end());
    }
    if (ranges.empty()) continue;
    std::sort(ranges.begin(), ranges.end(),
              [](const FileRegion& a, const FileRegion& b) { return a.offset < b.offset; });
    // Sums checked against what is left of the file, so no region can wrap.
    uint64_t at = 0;
    for (const FileRegion& r : ranges) {
      if (r.offset != at || r.bytes == 0 || r.bytes > size - at) {
        return bad(absl::StrCat("has regions that do not tile it: bytes from ", at,
                                r.offset > at    ? " are nobody's"
                                : r.offset == at ? " are listed empty or past its end"
                                                 : " are listed twice"));
      }
      at += r.bytes;
    }
    if (at != size) return bad(absl::StrCat("has regions that end at byte ", at, " of ", size));
  }
  return absl::OkStatus();
}

uint64_t CheckpointBytes(const CheckpointManifest& manifest) {
  std::set<std::string> counted;
  uint64_t bytes = 0;
  for (const CheckpointFile& f : manifest.files) {
    if (counted.insert(f.name).second) bytes += f.bytes;
  }
  return bytes;
}

std::string JobSpecDigest(const v1::JobSpec& spec) {
  std::string bytes;
  spec.SerializeToString(&bytes);
  return Xxh3Hex(XXH3_64bits(bytes.data(), bytes.size()));
}

absl::string_view StateDictTypeName(v1::StateDictType type) {
  switch (type) {
    case v1::SHARDED_STATE_DICT:
      return "SHARDED_STATE_DICT";
    case v1::LOCAL_STATE_DICT:
      return "LOCAL_STATE_DICT";
    default:
      return "FULL_STATE_DICT";
  }
}

absl::StatusOr<v1::StateDictType> ParseStateDictType(absl::string_view name) {
  std::string upper = absl::AsciiStrToUpper(name);
  if (!absl::EndsWith(upper, "_STATE_DICT")) absl::StrAppend(&upper, "_STATE_DICT");
  if (upper == "FULL_STATE_DICT") return v1::FULL_STATE_DICT;
  if (upper == "SHARDED_STATE_DICT") return v1::SHARDED_STATE_DICT;
  if (upper == "LOCAL_STATE_DICT") return v1::LOCAL_STATE_DICT;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown state dict type '", name, "'; expected full, sharded or local"));
}

std::string RankFileName(absl::string_view kind, int rank, int world_size) {
  return absl::StrFormat("%s-rank%05d-of-%05d.safetensors", kind, rank, world_size);
}

absl::Status ValidateCheckpointName(absl::string_view name) {
  auto bad = [&](absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat("checkpoint name '", name, "' ", why));
  };
  if (name.empty()) return bad("is empty");
  if (name.size() > 128) return bad("is longer than 128 characters");
  for (char c : name) {
    if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '_' && c != '-') {
      return bad("may hold only letters, digits, '.', '_' and '-' (one path component)");
    }
  }
  if (name.front() == '.') return bad("may not start with '.'");
  if (absl::EndsWith(name, kPartialSuffix) || absl::EndsWith(name, ".tmp")) {
    return bad("may not end in .partial or .tmp (reserved for saves in progress)");
  }
  if (name == kLatestFileName) return bad("is reserved for the latest pointer");
  return absl::OkStatus();
}

std::string ManifestToJson(const CheckpointManifest& m) {
  Json json;
  json["format_version"] = m.format_version;
  json["name"] = m.name;
  json["job"] = m.job;
  json["job_spec_digest"] = m.job_spec_digest;
  json["step"] = m.step;
  json["state_dict_type"] = std::string(StateDictTypeName(m.state_dict_type));
  json["world_size"] = m.world_size;
  json["strategy"] = m.strategy;
  Json params = Json::object();
  for (const auto& [fqn, info] : m.params) {
    params[fqn] = {{"dtype", std::string(SafetensorsDTypeName(info.dtype))}, {"shape", info.shape}};
  }
  json["params"] = params;
  Json tied = Json::object();
  for (const auto& [alias, primary] : m.tied) tied[alias] = primary;
  json["tied"] = tied;
  json["optimizer"] = m.optimizer;
  json["optimizer_states"] = m.optimizer_states;
  json["data"] = {{"seed", m.data_seed},
                  {"global_batch_size", m.global_batch_size},
                  {"position", m.data_position}};
  json["rng"] = {{"init_seed", m.init_seed}};
  json["created_unix_micros"] = m.created_unix_micros;
  json["scheduled"] = m.scheduled;
  if (!m.converted_from.empty()) json["converted_from"] = m.converted_from;
  Json files = Json::array();
  for (const CheckpointFile& f : m.files) {
    Json file = {{"name", f.name}, {"rank", f.rank}, {"bytes", f.bytes}};
    if (f.regions.empty()) {
      file["xxh3"] = f.xxh3;
    } else {
      Json regions = Json::array();
      for (const FileRegion& r : f.regions) regions.push_back({r.offset, r.bytes, r.xxh3});
      file["regions"] = regions;
    }
    files.push_back(std::move(file));
  }
  json["files"] = files;
  std::string spec_json;
  google::protobuf::util::JsonPrintOptions options;
  options.preserve_proto_field_names = true;
  (void)google::protobuf::util::MessageToJsonString(m.job_spec, &spec_json, options);
  json["job_spec"] = Json::parse(spec_json);
  return json.dump(2) + "\n";
}

absl::StatusOr<CheckpointManifest> ParseManifest(absl::string_view text, absl::string_view what) {
  Json json = Json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (json.is_discarded() || !json.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(what, " is not a JSON object"));
  }
  const Fields fields(json, std::string(what));
  CheckpointManifest m;
  FS_FIELD(fields, "format_version", m.format_version);
  if (m.format_version < kRowChunkFormatVersion || m.format_version > kCheckpointFormatVersion) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, " has format_version ", m.format_version, "; this flatshard reads versions ",
        kRowChunkFormatVersion, " to ", kCheckpointFormatVersion));
  }
  FS_FIELD(fields, "name", m.name);
  FS_FIELD(fields, "job", m.job);
  FS_FIELD(fields, "job_spec_digest", m.job_spec_digest);
  FS_FIELD(fields, "step", m.step);
  if (m.step < 0) return absl::InvalidArgumentError(absl::StrCat(what, ": step is negative"));
  std::string type;
  FS_FIELD(fields, "state_dict_type", type);
  absl::StatusOr<v1::StateDictType> parsed_type = ParseStateDictType(type);
  if (!parsed_type.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": ", parsed_type.status().message()));
  }
  m.state_dict_type = *parsed_type;
  FS_FIELD(fields, "world_size", m.world_size);
  if (m.world_size <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": world_size must be positive"));
  }
  FS_FIELD(fields, "strategy", m.strategy);
  if (!json.contains("params") || !json["params"].is_object()) return fields.Missing("params");
  for (const auto& [fqn, value] : json["params"].items()) {
    const Fields param(value, absl::StrCat(what, " params['", fqn, "']"));
    std::string dtype;
    CheckpointTensorInfo info;
    FS_FIELD(param, "dtype", dtype);
    FS_FIELD(param, "shape", info.shape);
    absl::StatusOr<DType> parsed = ParseSafetensorsDType(dtype);
    if (!parsed.ok()) return parsed.status();
    info.dtype = *parsed;
    m.params[fqn] = std::move(info);
  }
  FS_FIELD(fields, "tied", m.tied);
  FS_FIELD(fields, "optimizer", m.optimizer);
  FS_FIELD(fields, "optimizer_states", m.optimizer_states);
  for (auto it = m.optimizer_states.begin(); it != m.optimizer_states.end(); ++it) {
    // A load stages each state once; a name listed twice is not a manifest
    // any writer makes.
    if (std::find(m.optimizer_states.begin(), it, *it) != it) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": optimizer_states lists '", *it, "' twice"));
    }
  }
  if (!json.contains("data")) return fields.Missing("data");
  const Fields data(json["data"], absl::StrCat(what, " data"));
  FS_FIELD(data, "seed", m.data_seed);
  FS_FIELD(data, "global_batch_size", m.global_batch_size);
  FS_FIELD(data, "position", m.data_position);
  if (!json.contains("rng")) return fields.Missing("rng");
  FS_FIELD(Fields(json["rng"], absl::StrCat(what, " rng")), "init_seed", m.init_seed);
  FS_FIELD(fields, "created_unix_micros", m.created_unix_micros);
  // A job's histories are ordered by it, and the saves after it stamped
  // later: a time past year 9999 (or before 1970) is no writer's.
  constexpr int64_t kYear10000UnixMicros = 253402300800LL * 1000000;
  if (m.created_unix_micros < 0 || m.created_unix_micros >= kYear10000UnixMicros) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": created_unix_micros ",
                                                   m.created_unix_micros,
                                                   " is not a time from 1970 to year 9999"));
  }
  if (json.contains("scheduled")) FS_FIELD(fields, "scheduled", m.scheduled);
  if (json.contains("converted_from")) FS_FIELD(fields, "converted_from", m.converted_from);
  if (!json.contains("files") || !json["files"].is_array()) return fields.Missing("files");
  for (const Json& value : json["files"]) {
    const Fields file(value, absl::StrCat(what, " files[]"));
    CheckpointFile f;
    FS_FIELD(file, "name", f.name);
    FS_FIELD(file, "rank", f.rank);
    FS_FIELD(file, "bytes", f.bytes);
    if (value.contains("regions")) {  // [[offset, bytes, xxh3], ...]
      std::vector<std::tuple<uint64_t, uint64_t, std::string>> regions;
      FS_FIELD(file, "regions", regions);
      for (auto& [offset, bytes, xxh3] : regions) f.regions.push_back({offset, bytes, xxh3});
    } else {
      FS_FIELD(file, "xxh3", f.xxh3);
    }
    if (f.name.empty() || f.name.find('/') != std::string::npos || f.name.front() == '.') {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": file name '", f.name, "' is not a plain file name"));
    }
    m.files.push_back(std::move(f));
  }
  RETURN_IF_ERROR(CheckFileRegions(m.files, what));
  if (!json.contains("job_spec")) return fields.Missing("job_spec");
  const std::string spec_json = json["job_spec"].dump();
  if (!google::protobuf::util::JsonStringToMessage(spec_json, &m.job_spec).ok()) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": job_spec is not a valid JobSpec"));
  }
  return m;
}

}  // namespace flatshard
