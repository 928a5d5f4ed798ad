// SPDX-License-Identifier: BSD-3-Clause
// Must NOT compile: a model whose sharding hook is misspelled (sharding_spek). ctest builds this file and
// requires the build to fail with the compiler naming the missing `sharding_spec` requirement.
#include "parallel/hook_model.hpp"

static_assert(titan::TrainableModel<titan::test::HookModel<false>>, "the model must satisfy TrainableModel");
