// SPDX-License-Identifier: BSD-3-Clause
// Must NOT compile: a model whose plan hook is misspelled (paralel_plan). ctest builds this file and
// requires the build to fail with the compiler naming the missing `parallel_plan` requirement.
#include "parallel/hook_model.hpp"

static_assert(titan::TrainableModel<titan::test::HookModel<false>>, "the model must satisfy TrainableModel");
