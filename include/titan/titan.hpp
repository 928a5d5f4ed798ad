// SPDX-License-Identifier: BSD-3-Clause
// The umbrella header: everything a training program needs. Heavier pieces (c10d) stay out of it.
#pragma once

#include "titan/core/config.hpp"
#include "titan/core/config_loader.hpp"
#include "titan/core/error.hpp"
#include "titan/core/log.hpp"
#include "titan/data/dataloader.hpp"
#include "titan/data/tokenizer.hpp"
#include "titan/metrics/metrics.hpp"
#include "titan/models/llama3/args.hpp"
#include "titan/models/llama3/model.hpp"
#include "titan/nn/attention.hpp"
#include "titan/nn/layers.hpp"
#include "titan/nn/rope.hpp"
#include "titan/optim/adamw.hpp"
#include "titan/optim/clip.hpp"
#include "titan/optim/lr_schedule.hpp"
#include "titan/train/loss.hpp"
#include "titan/train/data_setup.hpp"
#include "titan/train/model_concept.hpp"
#include "titan/train/trainer.hpp"
