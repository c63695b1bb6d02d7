#include "client/model_commands.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

#include "client/cli_output.h"
#include "client/text_dataset.h"
#include "core/yaml_fields.h"
#include "storage/spec_files.h"

namespace flatshard {

void ModelCommands::Add(CLI::App& app) {
  CLI::App* data = app.add_subcommand("data", "Prepare data sets for FILE jobs");
  data->require_subcommand(1);
  prepare_text_ = data->add_subcommand(
      "prepare-text",
      "Byte-level tokens of text files as the .npy windows a FILE job reads: DIR/train and "
      "DIR/val (a held-out tail of the text)");
  prepare_text_->add_option("files", text_files_, "Text files, concatenated in this order")
      ->required()
      ->check(CLI::ExistingFile);
  prepare_text_->add_option("-o,--output", output_dir_, "Directory to write")->required();
  prepare_text_->add_option("--seq-len", seq_len_, "Tokens per window (the job's sequence_length)")
      ->capture_default_str();
  prepare_text_
      ->add_option("--validation-fraction", validation_fraction_,
                   "Share of the text held out for validation")
      ->capture_default_str();
  prepare_text_->add_flag("--squeeze-spaces", squeeze_spaces_,
                          "Make every run of spaces and tabs one space (indented or centred text)");

  eval_ = app.add_subcommand(
      "eval", "Mean cross-entropy and perplexity of a trained token model on a data set");
  AddModelSource(eval_);
  eval_->add_option("--data", data_dir_, "Directory with inputs.npy and labels.npy (e.g. DIR/val)")
      ->required();

  generate_ =
      app.add_subcommand("generate", "Sample text from a trained byte-level language model");
  AddModelSource(generate_);
  generate_->add_option("--prompt", prompt_, "Text to continue")->capture_default_str();
  generate_->add_option("-n,--tokens", sampling_.tokens, "Bytes to generate")
      ->capture_default_str();
  generate_->add_option("--temperature", sampling_.temperature, "Sampling temperature (> 0)")
      ->capture_default_str();
  generate_->add_option("--top-k", sampling_.top_k, "Sample among the k likeliest (0: all)")
      ->capture_default_str();
  generate_->add_option("--seed", sampling_.seed, "Sampling seed")->capture_default_str();
}

void ModelCommands::AddModelSource(CLI::App* command) {
  CLI::Option* checkpoint =
      command->add_option("--checkpoint", checkpoint_,
                          "A committed FULL or SHARDED checkpoint directory (model and weights)");
  CLI::Option* model =
      command->add_option("--model", model_file_, "Or: a model spec file (with --weights)");
  CLI::Option* weights =
      command->add_option("--weights", weights_file_,
                          "A safetensors file of every parameter (`flatshard summon --out`)");
  checkpoint->excludes(model)->excludes(weights);
  model->needs(weights);
  weights->needs(model);
}

int ModelCommands::Run(std::ostream& out, std::ostream& err) {
  if (prepare_text_ != nullptr && prepare_text_->parsed()) return PrepareText(out, err);
  if (eval_ != nullptr && eval_->parsed()) return Eval(out, err);
  if (generate_ != nullptr && generate_->parsed()) return Generate(out, err);
  return -1;
}

absl::StatusOr<std::unique_ptr<LanguageModel>> ModelCommands::Load() const {
  if (!checkpoint_.empty()) return LanguageModel::FromCheckpoint(checkpoint_);
  if (!model_file_.empty()) return LanguageModel::FromFiles(model_file_, weights_file_);
  return absl::InvalidArgumentError("give --checkpoint DIR, or --model FILE with --weights FILE");
}

int ModelCommands::PrepareText(std::ostream& out, std::ostream& err) {
  std::string text;
  for (const std::string& file : text_files_) {
    absl::StatusOr<std::string> contents = ReadTextFile(file);
    if (!contents.ok()) return ReportError("data prepare-text", contents.status(), err);
    out << absl::StrFormat("read %s (%d bytes)\n", file, contents->size());
    if (!text.empty() && text.back() != '\n') text += '\n';
    text += *contents;
  }
  if (squeeze_spaces_) text = SqueezeSpaces(text);
  absl::StatusOr<TextDataset> dataset = MakeTextDataset(text, seq_len_, validation_fraction_);
  if (!dataset.ok()) return ReportError("data prepare-text", dataset.status(), err);
  if (absl::Status written = WriteTextDataset(*dataset, output_dir_); !written.ok()) {
    return ReportError("data prepare-text", written, err);
  }
  out << absl::StrFormat(
      "wrote %s: %d bytes of text as byte tokens (vocab %d); train %d windows of %d, "
      "val %d windows\n",
      output_dir_, dataset->bytes, kByteVocabSize, dataset->train.samples, seq_len_,
      dataset->validation.samples);
  return 0;
}

int ModelCommands::Eval(std::ostream& out, std::ostream& err) {
  absl::StatusOr<std::unique_ptr<LanguageModel>> model = Load();
  if (!model.ok()) return ReportError("eval", model.status(), err);
  absl::StatusOr<EvalResult> result = (*model)->Evaluate(data_dir_);
  if (!result.ok()) return ReportError("eval", result.status(), err);
  out << absl::StrFormat("loss %.4f  perplexity %.2f  over %d tokens of %s (uniform: %.4f)\n",
                         result->loss, std::exp(result->loss), result->tokens, data_dir_,
                         std::log(static_cast<double>((*model)->vocab_size())));
  return 0;
}

int ModelCommands::Generate(std::ostream& out, std::ostream& err) {
  absl::StatusOr<std::unique_ptr<LanguageModel>> model = Load();
  if (!model.ok()) return ReportError("generate", model.status(), err);
  if ((*model)->vocab_size() != kByteVocabSize) {
    err << absl::StrFormat(
        "generate: the model's vocabulary has %d tokens; generate decodes byte-level models "
        "(%d), as `flatshard data prepare-text` makes\n",
        (*model)->vocab_size(), kByteVocabSize);
    return 2;
  }
  absl::StatusOr<std::vector<int32_t>> tokens = (*model)->Generate(EncodeBytes(prompt_), sampling_);
  if (!tokens.ok()) return ReportError("generate", tokens.status(), err);
  out << prompt_ << DecodeBytes(*tokens) << "\n";
  return 0;
}

}  // namespace flatshard
