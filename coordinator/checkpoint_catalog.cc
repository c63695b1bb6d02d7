#include "coordinator/checkpoint_catalog.h"

#include <algorithm>
#include <filesystem>
#include <set>
#include <system_error>
#include <tuple>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "spdlog/spdlog.h"

#include "core/status_macros.h"
#include "storage/durable_file.h"
#include "storage/safetensors_reader.h"

namespace flatshard {

namespace fs = std::filesystem;

CheckpointCatalog::CheckpointCatalog(const std::string& root, const std::string& job)
    : job_(job), job_dir_(absl::StrCat(root, "/", job)) {}

std::string CheckpointCatalog::RelativeDir(const std::string& name) const {
  return absl::StrCat(job_, "/", name);
}

std::string CheckpointCatalog::RelativePartialDir(const std::string& name) const {
  return absl::StrCat(job_, "/", name, kPartialSuffix);
}

absl::Status CheckpointCatalog::BeginSave(const std::string& name) {
  std::lock_guard<std::recursive_mutex> lock(mu_);
  RETURN_IF_ERROR(ValidateCheckpointName(name));
  std::error_code ec;
  fs::create_directories(job_dir_, ec);
  if (ec) {
    return absl::UnavailableError(absl::StrCat("cannot create ", job_dir_, ": ", ec.message()));
  }
  // The job directory's entry in the root is made durable too (once: by the
  // first save that succeeds at it), or a power loss could take the job
  // directory, and the checkpoint in it, with it: the commit fsyncs only the
  // job directory and the checkpoint's.
  if (!job_dir_durable_) {
    RETURN_IF_ERROR(FsyncPath(fs::path(job_dir_).parent_path().string()));
    job_dir_durable_ = true;
  }
  if (fs::exists(Path(name), ec)) {
    return absl::AlreadyExistsError(absl::StrCat("checkpoint '", name, "' of job '", job_,
                                                 "' already exists; pick another name or "
                                                 "delete it first (flatshard ckpt rm ",
                                                 name, ")"));
  }
  const std::string partial = Path(name) + std::string(kPartialSuffix);
  fs::remove_all(partial, ec);  // a save that crashed before committing
  if (ec) {
    // Not into a directory holding that save's files (create_directory
    // below would find it there and say nothing).
    return absl::UnavailableError(
        absl::StrCat("cannot remove the earlier ", partial, ": ", ec.message()));
  }
  fs::create_directory(partial, ec);
  if (ec) {
    return absl::UnavailableError(absl::StrCat("cannot create ", partial, ": ", ec.message()));
  }
  return absl::OkStatus();
}

void CheckpointCatalog::AbandonSave(const std::string& name) {
  std::lock_guard<std::recursive_mutex> lock(mu_);
  std::error_code ec;
  fs::remove_all(Path(name) + std::string(kPartialSuffix), ec);
}

std::vector<std::string> CheckpointCatalog::RemoveStalePartials() {
  std::lock_guard<std::recursive_mutex> lock(mu_);
  std::vector<std::string> removed;
  std::error_code ec;
  for (const fs::directory_entry& entry : fs::directory_iterator(job_dir_, ec)) {
    const std::string file = entry.path().filename().string();
    if (!entry.is_directory(ec) || !absl::EndsWith(file, kPartialSuffix)) continue;
    std::error_code removing;
    fs::remove_all(entry.path(), removing);
    if (!removing) removed.push_back(file.substr(0, file.size() - kPartialSuffix.size()));
  }
  return removed;
}

std::string CheckpointCatalog::LatestName() const {
  absl::StatusOr<std::string> text = ReadFileToString(Path(std::string(kLatestFileName)));
  if (!text.ok()) return "";
  return std::string(absl::StripAsciiWhitespace(*text));
}

absl::Status CheckpointCatalog::WriteLatest(const std::string& name) {
  return WriteFileDurably(Path(std::string(kLatestFileName)), name + "\n");
}

absl::StatusOr<v1::CheckpointInfo> CheckpointCatalog::Commit(const CheckpointManifest& manifest,
                                                             int keep_last) {
  std::lock_guard<std::recursive_mutex> lock(mu_);
  const std::string partial = Path(manifest.name) + std::string(kPartialSuffix);
  // The files the workers reported must all be there, whole, before the
  // manifest vouches for them: each at the size its writer reported, with a
  // valid header that fits it. Not re-hashed: the writer hashed the very bytes
  // it wrote and fsynced (from its buffer; a re-read here would come from
  // the same page cache, or over the network from a shared filesystem, a
  // whole checkpoint through one process). Every load hashes every file
  // before it changes anything, and `flatshard ckpt verify` does offline.
  // The ranks' parts of each file they wrote together must tile it: a gap
  // would be bytes nobody vouches for, and no reader could open the
  // checkpoint, so it is not committed.
  if (absl::Status tiled = CheckFileRegions(manifest.files, "the files the ranks reported");
      !tiled.ok()) {
    return absl::DataLossError(tiled.message());
  }
  uint64_t bytes = 0;
  std::set<std::string> checked;
  for (const CheckpointFile& f : manifest.files) {
    // Names come from the workers: plain file names in this directory only.
    if (f.name.empty() || f.name.front() == '.' || f.name.find('/') != std::string::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat("rank ", f.rank, " reported file '", f.name, "', not a plain file name"));
    }
    const std::string path = absl::StrCat(partial, "/", f.name);
    std::error_code size_error;
    const uintmax_t size = fs::file_size(path, size_error);
    if (size_error) {
      return absl::DataLossError(absl::StrCat("rank ", f.rank, " reported ", path,
                                              ", which cannot be read: ", size_error.message()));
    }
    if (size != f.bytes) {
      return absl::DataLossError(
          absl::StrCat(path, " has ", size, " bytes; rank ", f.rank, " reported ", f.bytes));
    }
    if (!checked.insert(f.name).second) continue;  // another writer's part of the same file
    absl::StatusOr<std::unique_ptr<SafetensorsReader>> header = SafetensorsReader::Open(path);
    if (!header.ok()) {
      return absl::DataLossError(
          absl::StrCat("rank ", f.rank, " reported ", f.name, ": ", header.status().message()));
    }
    bytes += size;
  }
  // Durable with its directory entry (WriteFileDurably fsyncs `partial`
  // itself, so the data files' entries are on disk too before the rename).
  RETURN_IF_ERROR(
      WriteFileDurably(absl::StrCat(partial, "/", kManifestFileName), ManifestToJson(manifest)));
  std::error_code ec;
  fs::rename(partial, Path(manifest.name), ec);
  if (ec) {
    return absl::UnavailableError(
        absl::StrCat("cannot rename ", partial, " to ", Path(manifest.name), ": ", ec.message()));
  }
  // Committed from here on: what follows is reported, never turned into a
  // failure of a checkpoint that exists.
  if (absl::Status synced = FsyncPath(job_dir_); !synced.ok()) {
    spdlog::warn("job {}: checkpoint {} committed, but {}", job_, manifest.name,
                 std::string(synced.message()));
  }
  bool latest = true;
  if (absl::Status moved = WriteLatest(manifest.name); !moved.ok()) {
    latest = false;
    spdlog::error("job {}: checkpoint {} committed, but `latest` still names the previous one: {}",
                  job_, manifest.name, std::string(moved.message()));
  }
  if (keep_last > 0 && manifest.scheduled) Retire(keep_last);
  NotifyChanged();
  v1::CheckpointInfo info;
  info.set_name(manifest.name);
  info.set_step(manifest.step);
  info.set_state_dict_type(manifest.state_dict_type);
  info.set_world_size(manifest.world_size);
  info.set_bytes(static_cast<int64_t>(bytes));
  info.set_latest(latest);
  info.set_created_unix_micros(manifest.created_unix_micros);
  return info;
}

void CheckpointCatalog::Retire(int keep_last) {
  absl::StatusOr<std::vector<v1::CheckpointInfo>> all = List();
  if (!all.ok()) {
    spdlog::warn("job {}: retention skipped: {}", job_, std::string(all.status().message()));
    return;
  }
  std::vector<std::string> scheduled;
  for (const v1::CheckpointInfo& info : *all) {
    absl::StatusOr<CheckpointManifest> m = Read(info.name());
    if (m.ok() && m->scheduled) scheduled.push_back(info.name());
  }
  const int excess = static_cast<int>(scheduled.size()) - keep_last;
  const std::string latest = LatestName();
  for (int i = 0; i < excess; ++i) {
    const std::string& old = scheduled[static_cast<size_t>(i)];
    // What `latest` names (its update may have failed) and what a load is
    // reading stay; a later retirement takes them.
    if (old == latest || pinned_.contains(old)) {
      spdlog::info("job {}: keeping scheduled checkpoint {} beyond keep_last {}: {}", job_, old,
                   keep_last, old == latest ? "`latest` names it" : "it is being loaded");
      continue;
    }
    spdlog::info("job {}: retiring scheduled checkpoint {} (keep_last {})", job_, old, keep_last);
    if (absl::Status removed = RemoveCommitted(old); !removed.ok()) {
      spdlog::warn("job {}: cannot retire checkpoint {}: {}", job_, old,
                   std::string(removed.message()));
    }
  }
}

absl::Status CheckpointCatalog::RemoveCommitted(const std::string& name) {
  // Out of the catalog in one step, renamed to a partial name: no reader
  // sees the checkpoint's directory half removed, and a crash (or a removal
  // that fails, as on NFS with a file still open elsewhere) leaves a partial
  // the next start sweeps (RemoveStalePartials) and the next save of the
  // name replaces (BeginSave). Not fsynced: either name is a consistent
  // state after a crash. No save is writing `doomed`: BeginSave refuses a
  // name that exists, so no save of this committed name can have started.
  std::error_code ec;
  const std::string doomed = Path(name) + std::string(kPartialSuffix);
  fs::remove_all(doomed, ec);
  fs::rename(Path(name), doomed, ec);
  if (ec) {
    return absl::UnavailableError(absl::StrCat("cannot remove ", Path(name), ": ", ec.message()));
  }
  if (fs::remove_all(doomed, ec); ec) {
    spdlog::warn("job {}: removed checkpoint {} from the catalog, but cannot remove {}: {}", job_,
                 name, doomed, ec.message());
  }
  return absl::OkStatus();
}

absl::StatusOr<CheckpointManifest> CheckpointCatalog::Read(const std::string& name) const {
  std::lock_guard<std::recursive_mutex> lock(mu_);
  std::string resolved = name;
  if (name == kLatestFileName) {
    resolved = LatestName();
    if (resolved.empty()) {
      return absl::NotFoundError(absl::StrCat("job '", job_, "' has no checkpoints yet"));
    }
  }
  RETURN_IF_ERROR(ValidateCheckpointName(resolved));
  const std::string path = absl::StrCat(Path(resolved), "/", kManifestFileName);
  absl::StatusOr<std::string> text = ReadFileToString(path);
  if (absl::IsNotFound(text.status())) {
    std::vector<std::string> names;
    if (absl::StatusOr<std::vector<v1::CheckpointInfo>> all = List(); all.ok()) {
      for (const auto& info : *all) names.push_back(info.name());
    }
    return absl::NotFoundError(absl::StrCat(
        "job '", job_, "' has no checkpoint '", resolved, "' (",
        names.empty() ? "it has none" : absl::StrCat("it has ", absl::StrJoin(names, ", ")), ")"));
  }
  if (!text.ok()) return text.status();
  ASSIGN_OR_RETURN(CheckpointManifest manifest, ParseManifest(*text, path));
  manifest.name = resolved;  // the directory is the checkpoint's name, wherever it came from
  return manifest;
}

bool CheckpointCatalog::Exists(const std::string& name) const {
  std::error_code ec;
  return fs::exists(Path(name), ec);
}

absl::StatusOr<std::vector<v1::CheckpointInfo>> CheckpointCatalog::List() const {
  std::lock_guard<std::recursive_mutex> lock(mu_);
  struct Listed {
    int64_t created_unix_micros;
    bool saved;  // not a copy (CheckpointManifest::converted_from)
    std::string name;
    v1::CheckpointInfo info;
  };
  std::vector<Listed> found;
  std::error_code ec;
  if (!fs::exists(job_dir_, ec)) return std::vector<v1::CheckpointInfo>{};
  const std::string latest = LatestName();
  for (const auto& entry : fs::directory_iterator(job_dir_, ec)) {
    if (!entry.is_directory()) continue;
    const std::string name = entry.path().filename().string();
    if (!ValidateCheckpointName(name).ok()) continue;  // partial saves
    const std::string path = absl::StrCat(entry.path().string(), "/", kManifestFileName);
    absl::StatusOr<std::string> text = ReadFileToString(path);
    if (!text.ok()) continue;
    absl::StatusOr<CheckpointManifest> m = ParseManifest(*text, path);
    if (!m.ok()) continue;
    v1::CheckpointInfo info;
    info.set_name(name);
    info.set_step(m->step);
    info.set_state_dict_type(m->state_dict_type);
    info.set_world_size(m->world_size);
    info.set_bytes(static_cast<int64_t>(CheckpointBytes(*m)));
    info.set_latest(name == latest);
    info.set_created_unix_micros(m->created_unix_micros);
    info.set_converted_from(m->converted_from);
    found.push_back({m->created_unix_micros, m->converted_from.empty(), name, std::move(info)});
  }
  if (ec) return absl::UnavailableError(absl::StrCat("cannot list ", job_dir_, ": ", ec.message()));
  // By time; of equal times, copies first (a copy has its source's time),
  // so that the newest is never a copy of it; then by name.
  std::sort(found.begin(), found.end(), [](const Listed& a, const Listed& b) {
    return std::tie(a.created_unix_micros, a.saved, a.name) <
           std::tie(b.created_unix_micros, b.saved, b.name);
  });
  std::vector<v1::CheckpointInfo> out;
  out.reserve(found.size());
  for (Listed& c : found) out.push_back(std::move(c.info));
  return out;
}

absl::Status CheckpointCatalog::Delete(const std::string& name) {
  std::lock_guard<std::recursive_mutex> lock(mu_);
  RETURN_IF_ERROR(Read(name).status());
  RETURN_IF_ERROR(RemoveCommitted(name));
  std::error_code ec;
  if (LatestName() == name) {
    ASSIGN_OR_RETURN(std::vector<v1::CheckpointInfo> rest, List());
    if (rest.empty()) {
      fs::remove(Path(std::string(kLatestFileName)), ec);
    } else {
      RETURN_IF_ERROR(WriteLatest(rest.back().name()));
    }
  }
  NotifyChanged();
  return absl::OkStatus();
}

CheckpointCatalog::Pin::Pin(CheckpointCatalog* catalog, std::string name)
    : catalog_(catalog), name_(std::move(name)) {
  std::lock_guard<std::recursive_mutex> lock(catalog_->mu_);
  ++catalog_->pinned_[name_];
}

CheckpointCatalog::Pin::~Pin() {
  std::lock_guard<std::recursive_mutex> lock(catalog_->mu_);
  if (--catalog_->pinned_[name_] == 0) catalog_->pinned_.erase(name_);
}

void CheckpointCatalog::set_on_change(
    std::function<void(const std::vector<v1::CheckpointInfo>&)> observer) {
  std::lock_guard<std::recursive_mutex> lock(mu_);
  on_change_ = std::move(observer);
}

void CheckpointCatalog::NotifyChanged() {
  std::lock_guard<std::recursive_mutex> lock(mu_);
  if (!on_change_) return;
  absl::StatusOr<std::vector<v1::CheckpointInfo>> all = List();
  if (all.ok()) on_change_(*all);
}

}  // namespace flatshard
