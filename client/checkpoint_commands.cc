#include "client/checkpoint_commands.h"

#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "nlohmann/json.hpp"

#include "client/cli_output.h"
#include "client/flatshard_client.h"
#include "storage/checkpoint_convert.h"
#include "storage/checkpoint_reader.h"

namespace flatshard {
namespace {

std::string Megabytes(int64_t bytes) {
  return absl::StrFormat("%.1f MB", static_cast<double>(bytes) / 1e6);
}

std::string ShortType(v1::StateDictType type) {
  std::string name(StateDictTypeName(type));
  return name.substr(0, name.find('_'));
}

}  // namespace

void CheckpointCommands::Add(CLI::App& app) {
  CLI::App* ckpt = app.add_subcommand(
      "ckpt",
      "Checkpoints: save/load/ls/rm through the coordinator; inspect/verify/consolidate/"
      "reshard a checkpoint directory offline");
  ckpt->require_subcommand(1);

  save_ = ckpt->add_subcommand(
      "save", "Save a checkpoint now (between two steps if another client is training)");
  save_->add_option("--name,-n", name_,
                    "Checkpoint name (default: step-<step>, or step-<step>-2, -3, ... where a "
                    "history the job left by a load took that name)");
  save_->add_flag("--async", async_,
                  "Snapshot to host memory and let training go on while the files are "
                  "written (returns when committed)");
  save_->add_option("--type,-t", type_,
                    "full, sharded or local (default: the job's state_dict_settings)");
  load_ = ckpt->add_subcommand(
      "load", "Load a checkpoint into the job: every rank stages it, then all apply it");
  load_->add_option("name", name_, "Checkpoint name, or latest")->required();
  ls_ = ckpt->add_subcommand("ls", "List the job's committed checkpoints, oldest first");
  rm_ = ckpt->add_subcommand("rm", "Delete a checkpoint");
  rm_->add_option("name", name_, "Checkpoint name")->required();
  for (CLI::App* command : {save_, load_, ls_, rm_}) {
    AddCoordinatorOption(command, coordinator_);
    AddJobOption(command, job_);
    command->add_flag("--json", json_, "Machine-readable output (JSON)");
  }

  inspect_ = ckpt->add_subcommand("inspect", "Print a checkpoint's manifest: step, type, tensors");
  verify_ = ckpt->add_subcommand(
      "verify", "Check every file of a checkpoint against its manifest (size, xxh3, header)");
  consolidate_ =
      ckpt->add_subcommand("consolidate",
                           "Write a FULL checkpoint (model.safetensors, optim.safetensors) from a "
                           "SHARDED or LOCAL one");
  reshard_ = ckpt->add_subcommand("reshard", "Write a SHARDED checkpoint for another world size");
  for (CLI::App* command : {inspect_, verify_, consolidate_, reshard_}) {
    command
        ->add_option("dir", path_, "Checkpoint directory, e.g. checkpoints/mlp-demo/step-00000030")
        ->required()
        ->check(CLI::ExistingDirectory);
  }
  inspect_->add_flag("--json", json_, "Print the manifest as JSON");
  for (CLI::App* command : {consolidate_, reshard_}) {
    command->add_option("--out,-o", out_path_, "New checkpoint directory (must not exist)")
        ->required();
  }
  reshard_->add_option("--world-size,-w", world_size_, "World size to shard for")->required();
}

int CheckpointCommands::Run(std::ostream& out, std::ostream& err) {
  if (save_ == nullptr) return -1;
  if (save_->parsed()) return Save(out, err);
  if (load_->parsed()) return Load(out, err);
  if (ls_->parsed()) return List(out, err);
  if (rm_->parsed()) return Remove(out, err);
  if (inspect_->parsed()) return Inspect(out, err);
  if (verify_->parsed()) return Verify(out, err);
  if (consolidate_->parsed()) return Convert(true, out, err);
  if (reshard_->parsed()) return Convert(false, out, err);
  return -1;
}

int CheckpointCommands::Save(std::ostream& out, std::ostream& err) {
  v1::SaveCheckpointRequest request;
  request.set_job(job_);
  request.set_name(name_);
  request.set_async_save(async_);
  if (!type_.empty()) {
    absl::StatusOr<v1::StateDictType> type = ParseStateDictType(type_);
    if (!type.ok()) return ReportError("ckpt save --type", type.status(), err);
    request.mutable_settings()->set_state_dict_type(*type);
  }
  FlatshardClient client(coordinator_);
  absl::StatusOr<v1::CheckpointProgress> done =
      client.SaveCheckpoint(request, [&](const v1::CheckpointProgress& progress) {
        if (!progress.done() && !json_) {
          out << "snapshot taken; training goes on while the files are written" << std::endl;
        }
      });
  if (!done.ok()) return ReportError("ckpt save", done.status(), err);
  if (json_) {
    out << MessageToJson(*done) << "\n";
  } else {
    out << "saved checkpoint '" << done->name() << "' at step " << done->step() << " ("
        << Megabytes(done->bytes_written()) << ") -> " << done->manifest_path() << "\n"
        << "resume from it with: flatshard ckpt load -j " << job_ << " " << done->name() << "\n";
  }
  return kExitOk;
}

int CheckpointCommands::Load(std::ostream& out, std::ostream& err) {
  FlatshardClient client(coordinator_);
  absl::StatusOr<v1::CheckpointProgress> done = client.LoadCheckpoint(job_, name_);
  if (!done.ok()) return ReportError("ckpt load", done.status(), err);
  if (json_) {
    out << MessageToJson(*done) << "\n";
  } else {
    out << "loaded checkpoint '" << done->name() << "' (" << Megabytes(done->bytes_written())
        << ", step " << done->step() << "); the next step trained is " << done->step() + 1 << "\n";
  }
  return kExitOk;
}

int CheckpointCommands::List(std::ostream& out, std::ostream& err) {
  FlatshardClient client(coordinator_);
  absl::StatusOr<std::vector<v1::CheckpointInfo>> all = client.ListCheckpoints(job_);
  if (!all.ok()) return ReportError("ckpt ls", all.status(), err);
  if (json_) {
    v1::ListCheckpointsResponse response;
    for (const v1::CheckpointInfo& info : *all) *response.add_checkpoints() = info;
    out << MessageToJson(response) << "\n";
    return kExitOk;
  }
  std::vector<std::vector<std::string>> rows;
  for (const v1::CheckpointInfo& info : *all) {
    rows.push_back({absl::StrCat(info.name(), info.latest() ? " (latest)" : "",
                                 info.converted_from().empty()
                                     ? ""
                                     : absl::StrCat(" (a copy of ", info.converted_from(), ")")),
                    absl::StrCat(info.step()), ShortType(info.state_dict_type()),
                    absl::StrCat(info.world_size()), Megabytes(info.bytes())});
  }
  PrintTable({"NAME", "STEP", "TYPE", "WORLD", "SIZE"}, rows, out);
  if (all->empty()) out << "(no checkpoints yet: flatshard ckpt save -j " << job_ << ")\n";
  bool targeted = false;
  for (const v1::CheckpointInfo& info : *all) {
    // Not always the latest: a job that loaded an older checkpoint left the
    // newer ones' history.
    if (info.recovery_target()) {
      out << "a recovery (or the job's next start) restores '" << info.name() << "'\n";
      targeted = true;
    }
  }
  if (!all->empty() && !targeted) {
    // An earlier job's of this name, say, or LOCAL ones at another world size.
    out << "none of these is one a recovery would restore now (of this job's history, loadable "
           "at its world size): a recovery (or the job's next start) begins again at its "
           "initialization (flatshard ckpt load -j "
        << job_ << " NAME takes one)\n";
  }
  return kExitOk;
}

int CheckpointCommands::Remove(std::ostream& out, std::ostream& err) {
  FlatshardClient client(coordinator_);
  if (absl::Status s = client.DeleteCheckpoint(job_, name_); !s.ok()) {
    return ReportError("ckpt rm", s, err);
  }
  if (!json_) out << "deleted checkpoint '" << name_ << "'\n";
  return kExitOk;
}

int CheckpointCommands::Inspect(std::ostream& out, std::ostream& err) {
  absl::StatusOr<std::unique_ptr<CheckpointReader>> reader = CheckpointReader::Open(path_);
  if (!reader.ok()) return ReportError("ckpt inspect", reader.status(), err);
  const CheckpointManifest& m = (*reader)->manifest();
  if (json_) {
    out << ManifestToJson(m);
    return kExitOk;
  }
  const auto bytes = static_cast<int64_t>(CheckpointBytes(m));
  std::set<std::string> names;
  for (const CheckpointFile& f : m.files) names.insert(f.name);
  out << "checkpoint " << m.name << " of job " << m.job << "\n";
  if (!m.converted_from.empty()) {
    out << "  a copy of checkpoint " << m.converted_from
        << " (its state and its time; ckpt consolidate or reshard wrote it)\n";
  }
  out << "  step " << m.step << ", data position " << m.data_position << "\n"
      << "  " << StateDictTypeName(m.state_dict_type) << " saved at world size " << m.world_size
      << " (" << m.strategy << ")\n"
      << "  optimizer " << m.optimizer
      << (m.optimizer_states.empty()
              ? ""
              : absl::StrCat(" (", absl::StrJoin(m.optimizer_states, ", "), ")"))
      << "\n"
      << "  " << m.params.size() << " parameters, " << names.size() << " files, "
      << Megabytes(bytes) << "\n";
  std::vector<std::vector<std::string>> rows;
  for (const auto& [fqn, info] : m.params) {
    rows.push_back({fqn, std::string(SafetensorsDTypeName(info.dtype)),
                    absl::StrCat("[", absl::StrJoin(info.shape, ", "), "]")});
  }
  PrintTable({"PARAMETER", "DTYPE", "SHAPE"}, rows, out);
  return kExitOk;
}

int CheckpointCommands::Verify(std::ostream& out, std::ostream& err) {
  absl::StatusOr<std::unique_ptr<CheckpointReader>> reader = CheckpointReader::Open(path_);
  if (!reader.ok()) return ReportError("ckpt verify", reader.status(), err);
  // One line per file; a file several ranks wrote (FULL, format version 3)
  // is verified region by region, each against the hash its writer recorded.
  std::vector<const CheckpointFile*> files;
  std::map<std::string, int> writers;
  std::map<std::string, size_t> regions;
  for (const CheckpointFile& f : (*reader)->manifest().files) {
    if (writers[f.name]++ == 0) files.push_back(&f);
    regions[f.name] += f.regions.size();
  }
  int bad = 0;
  for (const CheckpointFile* f : files) {
    absl::StatusOr<SafetensorsReader*> file = (*reader)->File(f->name);
    if (file.ok()) {
      out << "ok    " << f->name << " (" << Megabytes(static_cast<int64_t>(f->bytes))
          << (f->regions.empty() ? absl::StrCat(", xxh3 ", f->xxh3)
                                 : absl::StrCat(", ", regions[f->name], " regions from ",
                                                writers[f->name], " writers, each xxh3"))
          << ")\n";
    } else {
      ++bad;
      out << "BAD   " << f->name << ": " << file.status().message() << "\n";
    }
  }
  if (bad > 0) {
    err << "flatshard ckpt verify: " << bad << " of " << files.size()
        << " files failed; do not load this checkpoint\n";
    return kExitFailed;
  }
  out << "checkpoint " << path_ << " verified: " << files.size() << " files\n";
  return kExitOk;
}

int CheckpointCommands::Convert(bool consolidate, std::ostream& out, std::ostream& err) {
  auto progress = [&](const std::string& line) { out << "  " << line << std::endl; };
  absl::StatusOr<CheckpointManifest> written =
      consolidate ? ConsolidateCheckpoint(path_, out_path_, progress)
                  : ReshardCheckpoint(path_, out_path_, world_size_, progress);
  const char* command = consolidate ? "ckpt consolidate" : "ckpt reshard";
  if (!written.ok()) return ReportError(command, written.status(), err);
  out << "wrote " << StateDictTypeName(written->state_dict_type) << " checkpoint " << out_path_
      << " (world size " << written->world_size << ", step " << written->step << ")\n";
  return kExitOk;
}

}  // namespace flatshard
