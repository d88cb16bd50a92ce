// duet tokenize --model M --text T: the ids of T under M's tokenizer, space separated, no BOS
// unless --bos. --special: special-token texts in T become their ids (llama.cpp's parse_special).
// Only the tokenizer metadata is read, so a vocab-only GGUF (no tensors) is enough.
#include <cstdio>
#include <memory>
#include <string>

#include "cli/command.h"
#include "core/base/error.h"
#include "core/model/gguf.h"
#include "core/model/tokenizer.h"

namespace {

struct TokenizeArgs {
  std::string model;
  std::string text;
  bool add_bos = false;
  bool show_pieces = false;
  bool parse_special = false;
};

void run_tokenize(const TokenizeArgs& args) {
  const auto file = duet::GgufFile::open(args.model);
  const duet::Tokenizer tokenizer(duet::Vocab::from_gguf(*file));
  std::vector<int32_t> ids = tokenizer.encode(args.text, false, args.parse_special);
  // --bos prepends the BOS id whatever the vocab's add_bos_token says (the flag predates it).
  if (args.add_bos) {
    if (tokenizer.bos() < 0)
      throw duet::Error(duet::Errc::invalid_argument, args.model + " has no BOS token (--bos)");
    ids.insert(ids.begin(), tokenizer.bos());
  }
  std::string line;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i > 0) line += ' ';
    if (args.show_pieces) {
      line += tokenizer.vocab().pieces[static_cast<size_t>(ids[i])];
      line += '=';
    }
    line += std::to_string(ids[i]);
  }
  std::printf("%s\n", line.c_str());
}

duet::cli::RegisterCommand register_tokenize([](CLI::App& app) {
  auto args = std::make_shared<TokenizeArgs>();
  auto* cmd = app.add_subcommand(
      "tokenize", "Print the token ids of a text, space separated (no BOS unless --bos)");
  cmd->add_option("--model", args->model, "GGUF model whose tokenizer to use")->required();
  cmd->add_option("--text", args->text, "Text to tokenize")->required();
  cmd->add_flag("--bos", args->add_bos, "Prepend the BOS id");
  cmd->add_flag("--pieces", args->show_pieces, "Print piece=id instead of bare ids");
  cmd->add_flag("--special", args->parse_special,
                "Special-token texts (e.g. <|eot_id|>) in the text become their ids");
  cmd->callback([args] { run_tokenize(*args); });
});

}  // namespace
