#include "storage/checkpoint_convert.h"

#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

#include "core/flat_param_layout.h"
#include "core/job_config.h"
#include "core/model_spec.h"
#include "core/plan.h"
#include "core/sharded_tensor_pieces.h"
#include "core/status_macros.h"
#include "storage/checkpoint_reader.h"
#include "storage/durable_file.h"
#include "storage/safetensors_file_writer.h"

namespace flatshard {
namespace {

namespace fs = std::filesystem;

// Full tensors of a checkpoint of any type, by name: "<fqn>" in the model
// files, "<fqn>.<state>" and "<fqn>.step" in the optimizer files.
class TensorSource {
 public:
  static absl::StatusOr<std::unique_ptr<TensorSource>> Open(const std::string& dir) {
    auto source = std::unique_ptr<TensorSource>(new TensorSource());
    ASSIGN_OR_RETURN(source->reader_, CheckpointReader::Open(dir));
    // Its directory's name, which it is listed and loaded by (the manifest
    // keeps the name it was saved under, and the directory may be renamed).
    std::error_code error;
    fs::path path = fs::absolute(dir, error).lexically_normal();
    if (!path.has_filename()) path = path.parent_path();  // "step-30/"
    if (!error) source->name_ = path.filename().string();
    if (source->name_.empty()) source->name_ = source->manifest().name;  // "/"
    RETURN_IF_ERROR(source->reader_->VerifyAll());
    if (source->local()) RETURN_IF_ERROR(source->PlanLocal());
    return source;
  }

  const CheckpointManifest& manifest() const { return reader_->manifest(); }
  const std::string& name() const { return name_; }
  bool local() const { return manifest().state_dict_type == v1::LOCAL_STATE_DICT; }

  bool Has(absl::string_view kind, const std::string& name) {
    if (local()) {
      auto [fqn, state] = Split(kind, name);
      auto it = where_.find(fqn);
      if (it == where_.end()) return false;
      if (kind == "model") return true;
      const Unit& unit = plan_->units[static_cast<size_t>(it->second.first)].unit;
      if (!unit.params[static_cast<size_t>(it->second.second)].requires_grad) return false;
      absl::StatusOr<SafetensorsReader*> file =
          reader_->File(RankFileName("optim", 0, manifest().world_size));
      return file.ok() && (*file)->Find(absl::StrCat(FlatName(unit), ".", state)).ok();
    }
    for (const CheckpointFile& f : manifest().files) {
      if (!absl::StartsWith(f.name, kind)) continue;
      absl::StatusOr<SafetensorsReader*> file = reader_->File(f.name);
      if (file.ok() && (*file)->Find(name).ok()) return true;
    }
    return false;
  }

  absl::StatusOr<std::vector<float>> Read(absl::string_view kind, const std::string& name,
                                          const std::vector<int64_t>& shape) {
    if (!local()) return reader_->ReadFull(kind, name, shape);
    auto [fqn, state] = Split(kind, name);
    auto it = where_.find(fqn);
    if (it == where_.end()) return absl::NotFoundError(absl::StrCat("no parameter '", fqn, "'"));
    const UnitPlan& unit = plan_->units[static_cast<size_t>(it->second.first)];
    const auto i = static_cast<size_t>(it->second.second);
    if (state == "step") {
      ASSIGN_OR_RETURN(SafetensorsReader * file,
                       reader_->File(RankFileName("optim", 0, manifest().world_size)));
      return file->ReadFloats(absl::StrCat(FlatName(unit.unit), ".step"), 0, 1);
    }
    ASSIGN_OR_RETURN(const std::vector<float>* flat, LocalFlat(kind, it->second.first, state));
    const FlatRange& range = unit.layout.param_ranges()[i];
    return std::vector<float>(flat->begin() + range.start, flat->begin() + range.end + 1);
  }

 private:
  static std::string FlatName(const Unit& unit) { return JoinFqn(unit.module_fqn, "_flat_param"); }

  static std::pair<std::string, std::string> Split(absl::string_view kind,
                                                   const std::string& name) {
    if (kind == "model") return {name, ""};
    const size_t dot = name.rfind('.');
    return {name.substr(0, dot), name.substr(dot + 1)};
  }

  absl::Status PlanLocal() {
    ASSIGN_OR_RETURN(JobConfig job, JobConfigFromProto(manifest().job_spec));
    ASSIGN_OR_RETURN(Plan plan, ComputePlan(job.model, job.wrap_policy, job.world_size,
                                            job.sharding, job.optimizer));
    plan_ = std::move(plan);
    for (size_t u = 0; u < plan_->units.size(); ++u) {
      const Unit& unit = plan_->units[u].unit;
      for (size_t i = 0; i < unit.params.size(); ++i) {
        where_[unit.params[i].fqn] = {static_cast<int>(u), static_cast<int>(i)};
      }
    }
    return absl::OkStatus();
  }

  // The unpadded flat value of `unit` (the parameter, or state `state`),
  // assembled from the shards of shard ranks 0..shard_size-1.
  absl::StatusOr<const std::vector<float>*> LocalFlat(absl::string_view kind, int u,
                                                      const std::string& state) {
    const std::string key = absl::StrCat(kind, "/", u, "/", state);
    if (cached_key_ == key) return &cached_;
    const UnitPlan& unit = plan_->units[static_cast<size_t>(u)];
    const std::string name =
        state.empty() ? FlatName(unit.unit) : absl::StrCat(FlatName(unit.unit), ".", state);
    const auto s = static_cast<size_t>(unit.layout.sharded_numel());
    std::vector<float> flat;
    for (int r = 0; r < plan_->ranks.shard_size; ++r) {
      ASSIGN_OR_RETURN(SafetensorsReader * file,
                       reader_->File(RankFileName(kind, r, manifest().world_size)));
      ASSIGN_OR_RETURN(const SafetensorsEntry* entry, file->Find(name));
      ASSIGN_OR_RETURN(std::vector<float> shard, file->ReadFloats(name, 0, entry->numel()));
      if (shard.size() > s) {
        return absl::InvalidArgumentError(absl::StrCat(file->path(), ": '", name, "' holds ",
                                                       shard.size(), " elements, the shard ", s));
      }
      shard.resize(s, 0.0f);
      flat.insert(flat.end(), shard.begin(), shard.end());
    }
    flat.resize(static_cast<size_t>(unit.layout.unpadded_unsharded_numel()));
    cached_ = std::move(flat);
    cached_key_ = key;
    return &cached_;
  }

  std::unique_ptr<CheckpointReader> reader_;
  std::string name_;
  std::optional<Plan> plan_;
  std::map<std::string, std::pair<int, int>> where_;  // fqn -> (unit, param)
  std::string cached_key_;
  std::vector<float> cached_;
};

struct Entry {
  std::string kind;    // model / optim
  std::string name;    // tensor name in the output
  std::string source;  // tensor name to read
  std::vector<int64_t> shape;
};

// Writes the files of `m` (the manifest's `files` filled in as they are
// written) into `partial`.
absl::Status WriteConvertedFiles(TensorSource& source, const std::string& partial,
                                 const std::vector<Entry>& entries, CheckpointManifest& m,
                                 const ConvertProgress& progress);

absl::StatusOr<CheckpointManifest> WriteConverted(TensorSource& source, std::string out_dir,
                                                  v1::StateDictType type, int world_size,
                                                  const ConvertProgress& progress) {
  // `-o out/` names `out`, as the source path does.
  while (out_dir.size() > 1 && out_dir.back() == '/') out_dir.pop_back();
  CheckpointManifest m = source.manifest();
  m.name = fs::path(out_dir).filename().string();
  RETURN_IF_ERROR(ValidateCheckpointName(m.name));
  m.format_version = kCheckpointFormatVersion;
  m.state_dict_type = type;
  m.world_size = world_size;
  // created_unix_micros stays the source's: a copy holds the state saved
  // then, and a job whose directory it is written into places it in its
  // history by that time (coordinator/checkpoint_history.h). Stamped now,
  // a copy of a checkpoint of the history a load left would be taken for a
  // save of the new one, and a recovery would restore it.
  // Not scheduled: the user's copy, which keep_last never retires.
  m.scheduled = false;
  // Listed before its source, whose time it has (the catalog's order).
  m.converted_from = source.name();
  m.files.clear();
  std::vector<Entry> entries;
  for (const auto& [fqn, info] : m.params) entries.push_back({"model", fqn, fqn, info.shape});
  if (type == v1::FULL_STATE_DICT) {
    for (const auto& [alias, primary] : m.tied) {
      entries.push_back({"model", alias, primary, m.params.at(primary).shape});
    }
  }
  for (const std::string& state : m.optimizer_states) {
    for (const auto& [fqn, info] : m.params) {
      const std::string name = absl::StrCat(fqn, ".", state);
      if (source.Has("optim", name)) entries.push_back({"optim", name, name, info.shape});
    }
  }
  for (const auto& [fqn, info] : m.params) {
    const std::string name = absl::StrCat(fqn, ".step");
    if (source.Has("optim", name)) entries.push_back({"optim", name, name, {}});
  }
  std::error_code ec;
  if (fs::exists(out_dir, ec)) {
    return absl::AlreadyExistsError(absl::StrCat(out_dir, " already exists"));
  }
  const std::string partial = out_dir + std::string(kPartialSuffix);
  fs::remove_all(partial, ec);  // a conversion that was killed
  if (ec) {
    return absl::UnavailableError(
        absl::StrCat("cannot remove the earlier ", partial, ": ", ec.message()));
  }
  fs::create_directories(partial, ec);
  if (ec) {
    return absl::UnavailableError(absl::StrCat("cannot create ", partial, ": ", ec.message()));
  }
  absl::Status written = WriteConvertedFiles(source, partial, entries, m, progress);
  if (written.ok()) written = FsyncPath(partial);
  if (written.ok()) {
    fs::rename(partial, out_dir, ec);
    if (ec) {
      written = absl::UnavailableError(
          absl::StrCat("cannot rename ", partial, " to ", out_dir, ": ", ec.message()));
    }
  }
  if (!written.ok()) {
    // Nothing of a failed conversion stays behind: its finished files would
    // hold the space (a full disk is a likely cause) until someone found them.
    fs::remove_all(partial, ec);
    return written;
  }
  const std::string parent = fs::path(out_dir).parent_path().string();
  RETURN_IF_ERROR(FsyncPath(parent.empty() ? "." : parent));
  return m;
}

absl::Status WriteConvertedFiles(TensorSource& source, const std::string& partial,
                                 const std::vector<Entry>& entries, CheckpointManifest& m,
                                 const ConvertProgress& progress) {
  const v1::StateDictType type = m.state_dict_type;
  const int world_size = m.world_size;
  const bool full = type == v1::FULL_STATE_DICT;
  const int files_per_kind = full ? 1 : world_size;
  for (const char* kind : {"model", "optim"}) {
    for (int r = 0; r < files_per_kind; ++r) {
      const std::string file_name =
          full ? std::string(kind == std::string("model") ? kFullModelFile : kFullOptimFile)
               : RankFileName(kind, r, world_size);
      // SHARDED: without the target job's flat layouts, rank r's piece of a
      // tensor is its rows ChunkOf(dim0, W, r), written as a 1-D piece with
      // its offset (sharded_tensor_pieces.h: readers take any tiling); 0-dim
      // parameters go to rank 0, steps to every rank whole.
      std::vector<SafetensorsSlot> slots;
      struct Part {
        const Entry* entry;
        int64_t begin, count;
      };
      std::vector<Part> parts;
      std::map<std::string, int64_t> offsets;
      for (const Entry& e : entries) {
        if (e.kind != kind) continue;
        const int64_t numel = NumElements(e.shape);
        const bool step =
            std::string(kind) == "optim" && e.shape.empty() && absl::EndsWith(e.name, ".step");
        if (full || step) {
          slots.push_back({e.name, DType::kFloat32, e.shape});
          parts.push_back({&e, 0, numel});
          continue;
        }
        int64_t begin = r == 0 ? 0 : numel, count = r == 0 ? numel : 0;
        if (!e.shape.empty()) {
          const ChunkSlice rows = ChunkOf(e.shape[0], world_size, r);
          const int64_t row = e.shape[0] == 0 ? 0 : numel / e.shape[0];
          begin = rows.begin * row;
          count = rows.length * row;
        }
        if (count == 0) continue;
        slots.push_back({e.name, DType::kFloat32, {count}});
        parts.push_back({&e, begin, count});
        offsets[e.name] = begin;
      }
      std::map<std::string, std::string> metadata = {
          {"format", "flatshard"},
          {"state_dict_type", std::string(StateDictTypeName(type))},
          {"world_size", absl::StrCat(world_size)}};
      // A FULL file's header is the same whoever writes it (a saving
      // cluster's ranks write it together); a SHARDED file is its rank's.
      if (!full) metadata["rank"] = absl::StrCat(r);
      if (!full) metadata[std::string(kElementOffsetsKey)] = ElementOffsetsToJson(offsets);
      ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsFileWriter> writer,
                       SafetensorsFileWriter::Create(absl::StrCat(partial, "/", file_name),
                                                     std::move(slots), metadata));
      for (const Part& part : parts) {
        ASSIGN_OR_RETURN(std::vector<float> values,
                         source.Read(kind, part.entry->source, part.entry->shape));
        RETURN_IF_ERROR(writer->Append(part.entry->name, std::span<const float>(values).subspan(
                                                             static_cast<size_t>(part.begin),
                                                             static_cast<size_t>(part.count))));
      }
      ASSIGN_OR_RETURN(FileDigest digest, writer->Finish());
      m.files.push_back({file_name, r, digest.bytes, digest.xxh3, {}});
      if (progress) {
        progress(absl::StrFormat("wrote %s (%.1f MB)", file_name,
                                 static_cast<double>(digest.bytes) / 1e6));
      }
    }
  }
  return WriteFileDurably(absl::StrCat(partial, "/", kManifestFileName), ManifestToJson(m));
}

}  // namespace

absl::StatusOr<CheckpointManifest> ConsolidateCheckpoint(const std::string& src_dir,
                                                         const std::string& out_dir,
                                                         const ConvertProgress& progress) {
  ASSIGN_OR_RETURN(std::unique_ptr<TensorSource> source, TensorSource::Open(src_dir));
  return WriteConverted(*source, out_dir, v1::FULL_STATE_DICT, source->manifest().world_size,
                        progress);
}

absl::StatusOr<CheckpointManifest> ReshardCheckpoint(const std::string& src_dir,
                                                     const std::string& out_dir, int world_size,
                                                     const ConvertProgress& progress) {
  if (world_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--world-size must be at least 1, got ", world_size));
  }
  ASSIGN_OR_RETURN(std::unique_ptr<TensorSource> source, TensorSource::Open(src_dir));
  return WriteConverted(*source, out_dir, v1::SHARDED_STATE_DICT, world_size, progress);
}

}  // namespace flatshard
