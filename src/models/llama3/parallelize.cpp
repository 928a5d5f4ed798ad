// SPDX-License-Identifier: BSD-3-Clause
#include "titan/models/llama3/parallelize.hpp"

#include "titan/dist/mesh.hpp"
#include "titan/models/llama3/model.hpp"

namespace titan::llama3 {

std::vector<std::vector<std::string>> data_parallel_units(const Llama3& model) {
  std::vector<std::vector<std::string>> units{{"tok_embeddings"}};
  for (size_t i = 0; i < model.layers.size(); ++i) units.push_back({"layers." + std::to_string(i)});
  // Norm and output run back to back and start backward: one unit, one collective.
  if (model.output) {
    units.push_back({"norm", "output"});
  } else {
    units.push_back({"norm"});
  }
  return units;
}

std::vector<std::vector<std::string>> Llama3::data_parallel_units() const { return llama3::data_parallel_units(*this); }

std::shared_ptr<parallel::DataParallel> parallelize(Llama3& model, const dist::Mesh& mesh,
                                                    const parallel::DataParallelOptions& options) {
  return parallel::data_parallelize(model, data_parallel_units(model), mesh, options);
}

}  // namespace titan::llama3
