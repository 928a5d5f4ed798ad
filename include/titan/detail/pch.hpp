// SPDX-License-Identifier: BSD-3-Clause
// Precompiled header: the heavy LibTorch and third-party headers every titan TU pays for once.
#pragma once
#include <ATen/ATen.h>
#include <fmt/format.h>
#include <torch/autograd.h>
#include <torch/nn/module.h>
#include <nlohmann/json.hpp>
