#!/usr/bin/env python3
"""Accounts for every piece of ambient state in the library: what a forward could read without being handed it.

A model's forward gets what it computes with as arguments: tokens, the attention context (positions,
documents, the context-parallel split), its parameters through with_param (with FSDP's float8 form and
the tensor-parallel group as a parallel::WeightUse). This script lists every thread_local, every
namespace-scope mutable variable and every function-local mutable static under src/ and include/, and
requires each to be in the table below with its kind:

  index        finds state a parallelize() handle owns, by the subject's address (layout/attachments.hpp:
               one lifetime rule); the state itself is the handle's
  mode         an execution mode around a forward, as ATen's grad mode and autocast are: changes how a
               forward records for backward, never what it computes
  observe      metrics, profiling, progress, memory tracking: never changes a result
  process      per-process settings and registries read at build time, not by a forward's math
  init         weight initialisation (before any forward)

A new piece of ambient state fails the check until it is passed explicitly instead or added here with
its kind and reason. Model code (src/models, include/titan/models) may declare none but registries.

  scripts/check_ambient_state.py                         check the repository
  scripts/check_ambient_state.py --inject src/nn/attention.cpp="thread_local int depth = 0;" --expect depth
                                                         add a synthetic declaration and require that it is caught
"""
import argparse
import os
import re
import sys

# (path, name) -> (kind, why)
KNOWN = {
    ("src/layout/attachments.hpp", "count_"): ("index", "the fast path's entry count, a member of the index"),
    ("src/layout/sharded_param.cpp", "bound_params"): ("index", "parameters bound by live handles"),
    ("src/layout/sharded_param.cpp", "index"): ("index", "parameter bindings by TensorImpl"),
    ("src/layout/module_hooks.cpp", "hooked_modules"): ("index", "modules a live handle's TP style hooks"),
    ("src/layout/module_hooks.cpp", "index"): ("index", "TP hooks by module"),
    ("src/parallel/activation_checkpoint.cpp", "marked_modules"): ("index", "modules a live handle checkpoints"),
    ("src/parallel/activation_checkpoint.cpp", "index"): ("index", "checkpoint marks by module"),
    ("src/nn/saved_ops.cpp", "active_ops_"): ("mode", "per-operator AC: the checkpoint records or replays op "
                                              "outputs (C++ autograd has no saved-tensor hooks)"),
    ("src/nn/saved_ops.cpp", "active_phase_"): ("mode", "per-operator AC: record or replay"),
    ("src/nn/split_backward.cpp", "recording_"): ("mode", "split backward: a zero-bubble pipeline's forward "
                                                 "makes its layers' weight gradients deferrable into the (stage, "
                                                 "microbatch) queue it opened; values unchanged"),
    ("src/nn/bf16_gemm.cpp", "value"): ("process", "which bf16 GEMM kernel (TITAN_BF16_GEMM or timed once), as "
                                        "at::set_num_threads; both kernels are checked against at::mm"),
    ("src/nn/bf16_gemm.cpp", "timing"): ("observe", "the timing behind the bf16 GEMM choice, for the start-up line"),
    ("src/metrics/profiler.cpp", "kineto_holder"): ("observe", "the one Profiler holding Kineto's session"),
    ("src/core/log.cpp", "g_mutex"): ("observe", "serialises log lines"),
    ("src/core/memory_tracker.cpp", "table"): ("observe", "the memory tracker's bookings"),
    ("src/core/memory_tracker.cpp", "allocator"): ("observe", "the tracking allocator"),
    ("src/nn/init.cpp", "thread_seed"): ("init", "manual_init_seed: the seed InitSite::current() names streams with"),
    ("src/metrics/profiler.cpp", "tl_recorder"): ("observe", "the profiler's per-thread recorder"),
    ("src/core/memory_tracker.cpp", "state"): ("observe", "the memory tracker's per-thread category and owner"),
    ("src/core/memory_tracker.cpp", "once"): ("observe", "installs the tracking allocator once"),
    ("src/core/cpu_block_cache.cpp", "once"): ("process", "installs the large-block cache once"),
    ("src/dist/flight_recorder.cpp", "process"): ("observe", "the flight recorder's process state"),
    ("src/dist/flight_recorder.cpp", "g_process"): ("observe", "the flight recorder, for the signal handler"),
    ("src/dist/heartbeat.cpp", "s"): ("observe", "the step heartbeat"),
    ("src/train/preemption.cpp", "state"): ("process", "installed signal handlers"),
    ("src/train/preemption.cpp", "g_received"): ("process", "the signal received (read between steps)"),
    ("src/train/preemption.cpp", "g_armed_count"): ("process", "signal handler users"),
    ("src/models/registry.cpp", "r"): ("process", "the model registry (build time)"),
    ("src/data/dataset_registry.cpp", "r"): ("process", "the dataset registry (build time)"),
    ("src/core/config_presets.cpp", "r"): ("process", "config presets (parse time)"),
    ("src/core/config_presets.cpp", "builtins"): ("process", "registers the built-in presets once"),
    ("src/core/test_faults.cpp", "h"): ("process", "the test-only fault seam (set by tests, read between steps)"),
}
# Registries a model file may hold (read when a model is built, never by its forward).
MODEL_DIRS = ("src/models/", "include/titan/models/")
MODEL_ALLOWED_KINDS = {"process"}

THREAD_LOCAL = re.compile(r"^\s*(?:static\s+)?thread_local\s+[^;(]*?\b([A-Za-z_]\w*)\s*(?:=[^;]*|\{[^;]*\})?;")
# A function-local static: "static T name;", "= ...", "{...}" or "(args)" where args are expressions, not the
# "type name" parameters of a member function's declaration.
FUNCTION_STATIC = re.compile(r"^\s+static\s+(?!const\b|constexpr\b|inline\b|_assert|void\b)"
                             r"[\w:<>,\s*&]*?\b([A-Za-z_]\w*)\s*(?:;|\{|=|\(([\w:.&*, ]+)\)\s*;)")
NAMESPACE_VAR = re.compile(r"^(?!static\s+const|const|constexpr|inline|using|namespace|extern|template|typedef|struct|"
                           r"class|enum|return|#)(std::atomic<[^>]*>|int|int64_t|bool|std::[\w:<>, ]+?)\s+"
                           r"([A-Za-z_]\w*)\s*(?:\{[^;]*\}|=[^;]*)?;")
MEMBER_REF = re.compile(r"^\s+std::atomic<[^>]*>&\s+([A-Za-z_]\w*);")


def declarations(path, text):
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        stripped = line.split("//", 1)[0]
        for pattern in (THREAD_LOCAL, FUNCTION_STATIC, MEMBER_REF):
            m = pattern.match(stripped)
            if m and not (pattern is FUNCTION_STATIC and m.group(2) and re.search(r"\w\s+\w", m.group(2))):
                found.append((number, m.group(1), line.strip()))
                break
        else:
            m = NAMESPACE_VAR.match(stripped)
            if m and "(" not in stripped.split("=", 1)[0]:
                found.append((number, m.group(2), line.strip()))
    return found


def sources(root):
    for top in ("include", "src"):
        for folder, _, files in os.walk(os.path.join(root, top)):
            for name in sorted(files):
                if name.endswith((".hpp", ".cpp", ".h")):
                    path = os.path.join(folder, name)
                    yield os.path.relpath(path, root).replace(os.sep, "/"), path


def check(root, injected):
    problems, seen = [], set()
    for rel, path in sources(root):
        text = open(path, encoding="utf-8").read()
        if rel in injected:
            text += "\n" + injected[rel] + "\n"
        for number, name, line in declarations(rel, text):
            seen.add((rel, name))
            known = KNOWN.get((rel, name))
            if known is None:
                problems.append(f"{rel}:{number}: {name}: ambient state nobody accounted for ({line}). Pass it "
                                "explicitly (an argument, the attention context, parallel::WeightUse) or add it to "
                                "scripts/check_ambient_state.py with its kind and why a forward's result cannot "
                                "depend on it.")
            elif rel.startswith(MODEL_DIRS) and known[0] not in MODEL_ALLOWED_KINDS:
                problems.append(f"{rel}:{number}: {name}: model code holds {known[0]} state; models take what "
                                "they read as arguments.")
    for (rel, name) in sorted(set(KNOWN) - seen):
        problems.append(f"{rel}: {name}: listed in scripts/check_ambient_state.py but no longer declared; "
                        "remove it from the table.")
    return problems


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    parser.add_argument("--inject", action="append", default=[], help="FILE=DECLARATION appended to FILE")
    parser.add_argument("--expect", help="with --inject: succeed only if a problem names this")
    args = parser.parse_args()
    injected = dict(item.split("=", 1) for item in args.inject)
    problems = check(os.path.abspath(args.root), injected)
    if args.expect is not None:
        hit = [p for p in problems if args.expect in p]
        print("\n".join(hit) if hit else f"expected a problem naming '{args.expect}', got: {problems}")
        return 0 if hit else 1
    if problems:
        print("\n".join(problems))
        return 1
    kinds = {}
    for kind, _ in KNOWN.values():
        kinds[kind] = kinds.get(kind, 0) + 1
    print("ambient state accounted for: " + ", ".join(f"{n} {k}" for k, n in sorted(kinds.items())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
