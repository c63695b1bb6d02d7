// Commands for language models on text, all offline (no cluster):
//   flatshard data prepare-text FILE... -o DIR   text -> byte-token .npy files
//   flatshard eval --checkpoint DIR --data DIR   mean loss and perplexity
//   flatshard generate --checkpoint DIR          sample text from a trained model
#ifndef FLATSHARD_CLIENT_MODEL_COMMANDS_H_
#define FLATSHARD_CLIENT_MODEL_COMMANDS_H_

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/status/statusor.h"

#include "client/language_model.h"

namespace flatshard {

class ModelCommands {
 public:
  void Add(CLI::App& app);
  // The exit code when one of these commands was parsed, else -1.
  int Run(std::ostream& out, std::ostream& err);

 private:
  int PrepareText(std::ostream& out, std::ostream& err);
  int Eval(std::ostream& out, std::ostream& err);
  int Generate(std::ostream& out, std::ostream& err);
  absl::StatusOr<std::unique_ptr<LanguageModel>> Load() const;
  void AddModelSource(CLI::App* command);

  CLI::App* prepare_text_ = nullptr;
  CLI::App* eval_ = nullptr;
  CLI::App* generate_ = nullptr;
  std::vector<std::string> text_files_;
  std::string output_dir_;
  int64_t seq_len_ = 64;
  double validation_fraction_ = 0.1;
  bool squeeze_spaces_ = false;
  // The model: a checkpoint, or a model spec and a safetensors file.
  std::string checkpoint_;
  std::string model_file_;
  std::string weights_file_;
  std::string data_dir_;
  std::string prompt_ = "\n";
  SamplingOptions sampling_;
};

}  // namespace flatshard

#endif  // FLATSHARD_CLIENT_MODEL_COMMANDS_H_
