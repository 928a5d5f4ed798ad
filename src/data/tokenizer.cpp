// SPDX-License-Identifier: BSD-3-Clause
// load_tokenizer: finds tokenizer.json / tokenizer_config.json in a Hugging Face assets folder.
#include "titan/data/tokenizer.hpp"

#include <fmt/ranges.h>

#include <algorithm>

#include "titan/core/error.hpp"
#include "titan/core/log.hpp"
#include "titan/data/bpe_tokenizer.hpp"
#include "titan/data/sentencepiece_tokenizer.hpp"

namespace titan::data {

std::shared_ptr<Tokenizer> load_tokenizer(const std::filesystem::path& dir_or_file) {
  namespace fs = std::filesystem;
  const bool is_dir = fs::is_directory(dir_or_file);
  // A sentencepiece model: a .model file, or a folder with tokenizer.model and no tokenizer.json.
  if (dir_or_file.extension() == ".model") return load_sentencepiece(dir_or_file);
  if (is_dir && !fs::exists(dir_or_file / "tokenizer.json") && fs::exists(dir_or_file / "tokenizer.model")) {
    return load_sentencepiece(dir_or_file / "tokenizer.model");
  }
  const fs::path file = is_dir ? dir_or_file / "tokenizer.json" : dir_or_file;
  if (!fs::exists(file)) {
    std::vector<std::string> present;
    std::error_code ec;
    if (is_dir) {
      for (const auto& e : fs::directory_iterator(dir_or_file, ec)) present.push_back(e.path().filename().string());
    }
    std::sort(present.begin(), present.end());
    TITAN_CHECK_VALUE(false,
                      "[titan::data::load_tokenizer] expected a Hugging Face tokenizer.json at {}, got {}. "
                      "Point model.hf_assets_path at a folder holding tokenizer.json (+ tokenizer_config.json) or "
                      "a sentencepiece tokenizer.model, "
                      "or leave it without one to train a BPE on the dataset.",
                      file.string(),
                      is_dir ? fmt::format("a folder holding [{}]", fmt::join(present, ", ")) : "no such file");
  }
  const fs::path config = file.parent_path() / "tokenizer_config.json";
  auto tokenizer = BpeTokenizer::from_files(file, fs::exists(config) ? config : fs::path());
  auto show = [](std::optional<int32_t> id) { return id ? std::to_string(*id) : std::string("none"); };
  log::info("tokenizer: {} (vocab {}, bos {}, eos {})", file.string(), tokenizer->vocab_size(),
            show(tokenizer->bos_id()), show(tokenizer->eos_id()));
  if (!tokenizer->bos_id() || !tokenizer->eos_id()) {
    log::warn(
        "tokenizer {} has no {}: documents will be packed without it. tokenizer_config.json names them "
        "(bos_token, eos_token).",
        file.string(), tokenizer->bos_id() ? "EOS" : "BOS");
  }
  return tokenizer;
}

}  // namespace titan::data
