// The coordinator's side of a job's checkpoints on disk: <root>/<job>/ holds
// one directory per committed checkpoint, "<name>.partial/" while a save is in
// flight, and `latest` naming the newest. Commit is the second phase of
// docs/architecture.md §6's protocol: the workers have fsynced their files into the
// partial directory; the manifest is written (durably) last, the directory
// renamed to <name>, the job directory fsynced, and only then `latest` moved
// and old checkpoints retired. A crash at any point leaves either no <name>
// or a complete one.
#ifndef FLATSHARD_COORDINATOR_CHECKPOINT_CATALOG_H_
#define FLATSHARD_COORDINATOR_CHECKPOINT_CATALOG_H_

#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

#include "flatshard/v1/job.pb.h"
#include "storage/checkpoint_manifest.h"

namespace flatshard {

class CheckpointCatalog {
 public:
  CheckpointCatalog(const std::string& root, const std::string& job);

  const std::string& job_dir() const { return job_dir_; }
  // "<job>/<name>" and "<job>/<name>.partial": what workers are told.
  std::string RelativeDir(const std::string& name) const;
  std::string RelativePartialDir(const std::string& name) const;

  // Phase one: creates an empty <name>.partial/ (removing one a crashed save
  // left). ALREADY_EXISTS when <name> is committed; INVALID_ARGUMENT for a bad
  // name.
  absl::Status BeginSave(const std::string& name);
  // Removes <name>.partial/ after a failed save.
  void AbandonSave(const std::string& name);
  // Removes every <name>.partial/ (what a save a crash interrupted left) and
  // returns the names. Only when no save can be in flight: at job creation.
  std::vector<std::string> RemoveStalePartials();
  // Phase two. For a scheduled checkpoint, `keep_last` > 0 then deletes the
  // oldest scheduled checkpoints beyond that many (never on-demand ones, the
  // one `latest` names, or one a load has pinned).
  absl::StatusOr<v1::CheckpointInfo> Commit(const CheckpointManifest& manifest, int keep_last);

  // A committed checkpoint's manifest; "latest" resolves the pointer.
  // NOT_FOUND naming what exists when there is no such checkpoint.
  absl::StatusOr<CheckpointManifest> Read(const std::string& name) const;
  // Whether a committed checkpoint directory has this name (readable or not:
  // a save of it would be refused).
  bool Exists(const std::string& name) const;
  // Committed checkpoints, oldest first: by creation time; of equal times,
  // converted copies before the rest (a copy has its source's time); then by
  // name.
  absl::StatusOr<std::vector<v1::CheckpointInfo>> List() const;
  absl::Status Delete(const std::string& name);
  // Keeps retention off checkpoint `name` while it lives (a load reads it).
  class Pin {
   public:
    Pin(CheckpointCatalog* catalog, std::string name);
    ~Pin();
    Pin(const Pin&) = delete;
    Pin& operator=(const Pin&) = delete;

   private:
    CheckpointCatalog* catalog_;
    std::string name_;
  };

  // Called with the committed checkpoints after every commit, retirement and
  // delete, under the catalog's lock (the state store records them).
  void set_on_change(std::function<void(const std::vector<v1::CheckpointInfo>&)> observer);

 private:
  std::string Path(const std::string& name) const { return job_dir_ + "/" + name; }
  std::string LatestName() const;
  absl::Status WriteLatest(const std::string& name);
  // Takes committed checkpoint `name` out of the catalog (one rename), then
  // removes its files.
  absl::Status RemoveCommitted(const std::string& name);
  // Deletes the oldest scheduled checkpoints beyond `keep_last`; best effort.
  void Retire(int keep_last);
  void NotifyChanged();

  std::string job_;
  std::string job_dir_;
  // Commits run on the background committer while clients list, read and
  // delete: one directory operation at a time (Commit reads through List).
  mutable std::recursive_mutex mu_;
  // The root's entry for job_dir_ is known durable (fsynced since this
  // catalog made, or first saw, the directory); guarded by mu_.
  bool job_dir_durable_ = false;
  std::function<void(const std::vector<v1::CheckpointInfo>&)> on_change_;
  std::map<std::string, int> pinned_;  // names being loaded, with counts
};

}  // namespace flatshard

#endif  // FLATSHARD_COORDINATOR_CHECKPOINT_CATALOG_H_
