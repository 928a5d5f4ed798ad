#!/usr/bin/env python3
"""Accounts for every piece of ambient state in the library: what a forward could read without being handed it.

A model's forward gets what it computes with as arguments: tokens, the attention context (positions,
documents, the context-parallel split), its parameters through with_param (with FSDP's float8 form and
the tensor-parallel group as a parallel::WeightUse). Whatever else it could read lives in writable memory
that outlives a call, so this script reads it from the compiled library rather than from its text: every
object of libtitan.a (the objects compile_commands.json names, their basenames checked against the archive's
members) is listed with `objdump -t`, and every symbol of a writable section (.data, .bss, .tdata, .tbss and
their per-symbol COMDAT forms; not .data.rel.ro, which is read-only once relocated) is one: namespace-scope and
static member variables, thread_locals, function-local statics (a "guard variable for X" stands for X), inline
and template variables, whatever their type or spelling. Each is demangled, mapped back to the source file whose
object holds it, and must be in TABLE with its kind. The built programs' objects (examples, tools, benchmarks)
are read too, for titan's inline state they alone emit: statics of header templates they instantiate.

  index        finds state a parallelize() handle owns, by the subject's address (layout/attachments.hpp:
               one lifetime rule); the state itself is the handle's
  mode         an execution mode around a forward, as ATen's grad mode and autocast are: changes how a
               forward records for backward, never what it computes
  run          read by a forward's math and chosen per machine: settled once per run, the same on every rank,
               written to the run's run_state.json and to each checkpoint, and a resume that settles
               otherwise says so (the bf16 GEMM kernel)
  observe      metrics, profiling, logging, progress, memory tracking: never changes a result
  process      per-process settings, allocators and registries read at build time, not by a forward's math
  init         weight initialisation (before any forward)
  const        never written after its initialisation (a table, a regex, the CPU's description, a kernel
               pointer picked by the CPU's capability among builds that agree bitwise): a const object whose
               initialiser runs at start-up or first use sits in writable memory; the check confirms that its
               source declares it const

Symbols of other libraries' headers (std, c10, at, torch, fmt, ...: FOREIGN) and the toolchain's own (names
reserved to the implementation: a leading "__", "." or "DW.ref.") are not the library's state. A new piece of
ambient state fails the check until it is passed explicitly instead, made const or constexpr, or added to TABLE
with its kind and reason. Model code (src/models) may hold registries and constants only.

  scripts/check_ambient_state.py --build build            check the library built in build/
  scripts/check_ambient_state.py --build build --compile-probe build/ambient_state_probe
                                                          compile PROBE_FORMS (one synthetic source, the
                                                          library's own compile command) into that folder
  scripts/check_ambient_state.py --build build --probe build/ambient_state_probe --expect FORM
                                                          check the probe object against the table and
                                                          require that FORM's declaration is caught (FORM
                                                          from --list-forms)
"""
import argparse
import json
import os
import re
import shlex
import subprocess
import sys
from collections import namedtuple

KINDS = ("index", "mode", "run", "observe", "process", "init", "const")

# One row per piece of state: (source, name, kind, why). `name` is the demangled symbol with parameter lists
# reduced to "()", lambdas to "{lambda}" and ABI tags dropped; `source` the file whose object holds it (a
# header for inline state several objects emit).
TABLE = [
    # index: the attachments of live parallelize() handles (src/layout/attachments.hpp)
    ("src/layout/sharded_param.cpp", "titan::parallel::detail::bound_params", "index",
     "parameters bound by live handles (the fast path's entry count)"),
    ("src/layout/sharded_param.cpp", "titan::parallel::detail::(anonymous namespace)::bindings()::index", "index",
     "parameter bindings by TensorImpl"),
    ("src/layout/module_hooks.cpp", "titan::parallel::detail::hooked_modules", "index",
     "modules a live handle's TP style hooks (the fast path's entry count)"),
    ("src/layout/module_hooks.cpp", "titan::parallel::detail::(anonymous namespace)::hooks()::index", "index",
     "TP hooks by module"),
    ("src/parallel/activation_checkpoint.cpp", "titan::parallel::(anonymous namespace)::marked_modules", "index",
     "modules a live handle checkpoints (the fast path's entry count)"),
    ("src/parallel/activation_checkpoint.cpp", "titan::parallel::(anonymous namespace)::marks()::index", "index",
     "checkpoint marks by module"),
    # mode: how a forward records for backward
    ("src/nn/saved_ops.cpp", "titan::nn::(anonymous namespace)::active_ops_", "mode",
     "per-operator AC: the checkpoint records or replays op outputs (C++ autograd has no saved-tensor hooks)"),
    ("src/nn/saved_ops.cpp", "titan::nn::(anonymous namespace)::active_phase_", "mode",
     "per-operator AC: record or replay"),
    ("src/nn/split_backward.cpp", "titan::nn::(anonymous namespace)::recording_", "mode",
     "split backward: a zero-bubble pipeline's forward makes its layers' weight gradients deferrable into the "
     "(stage, microbatch) queue it opened; values unchanged"),
    # run: read by a forward's math, settled and recorded per run
    ("src/nn/bf16_gemm.cpp", "titan::nn::(anonymous namespace)::choice()::value", "run",
     "which bf16 GEMM kernel CPU forwards run (TITAN_BF16_GEMM or timed once; the kernels differ by up to one bf16 "
     "ulp): rank 0's on every rank, in run_state.json and train_state.bf16_gemm, a differing resume warns"),
    # observe
    ("src/nn/bf16_gemm.cpp", "titan::nn::(anonymous namespace)::measured()::timing", "observe",
     "the timing behind the bf16 GEMM choice, for the start-up line"),
    ("src/metrics/profiler.cpp", "titan::(anonymous namespace)::kineto_holder", "observe",
     "the one Profiler holding Kineto's session"),
    ("src/metrics/profiler.cpp", "titan::(anonymous namespace)::tl_recorder", "observe",
     "the profiler's per-thread recorder"),
    ("src/core/log.cpp", "titan::log::(anonymous namespace)::g_mutex", "observe", "serialises log lines"),
    ("src/core/log.cpp", "titan::log::(anonymous namespace)::g_level", "observe", "the log level"),
    ("src/core/log.cpp", "titan::log::(anonymous namespace)::g_rank", "observe", "the rank a log line names"),
    ("src/core/log.cpp", "titan::log::(anonymous namespace)::g_color", "observe", "whether log lines are coloured"),
    ("src/core/memory_tracker.cpp", "titan::(anonymous namespace)::bookings()::table", "observe",
     "the memory tracker's bookings"),
    ("src/core/memory_tracker.cpp", "titan::install_memory_tracking()::{lambda}::operator()()::allocator", "observe",
     "the tracking allocator (hands out the wrapped allocator's memory, books its bytes)"),
    ("src/core/memory_tracker.cpp", "titan::(anonymous namespace)::base_raw_deleter", "observe",
     "the wrapped allocator's raw deleter, which the tracking allocator's own calls"),
    ("src/core/memory_tracker.cpp", "titan::(anonymous namespace)::thread_state()::state", "observe",
     "the memory tracker's per-thread category and owner"),
    ("src/core/memory_tracker.cpp", "titan::install_memory_tracking()::once", "observe",
     "installs the tracking allocator once"),
    ("src/dist/flight_recorder.cpp", "titan::dist::(anonymous namespace)::process_owner()::process", "observe",
     "the flight recorder's process state"),
    ("src/dist/flight_recorder.cpp", "titan::dist::(anonymous namespace)::g_process", "observe",
     "the flight recorder, for the signal handler"),
    ("src/dist/heartbeat.cpp", "titan::dist::(anonymous namespace)::state()::s", "observe", "the step heartbeat"),
    # process
    ("src/core/cpu_block_cache.cpp", "titan::(anonymous namespace)::cache", "process",
     "the large-block CPU allocator cache once installed: where a tensor's memory comes from, never its values"),
    ("src/core/cpu_block_cache.cpp", "titan::install_cpu_block_cache()::once", "process",
     "installs the large-block cache once"),
    ("src/train/preemption_signals.cpp", "titan::detail::(anonymous namespace)::installed()::state", "process",
     "installed signal handlers and the actions they replaced"),
    ("src/train/preemption_signals.cpp", "titan::detail::(anonymous namespace)::g_armed", "process",
     "the armed signals (for the handler)"),
    ("src/train/preemption_signals.cpp", "titan::detail::(anonymous namespace)::g_received", "process",
     "the signal received (read between steps)"),
    ("src/train/preemption_signals.cpp", "titan::detail::(anonymous namespace)::g_armed_count", "process",
     "signal handler users"),
    ("src/models/registry.cpp", "titan::models::(anonymous namespace)::registry()::r", "process",
     "the model registry (build time)"),
    ("src/data/dataset_registry.cpp", "titan::data::(anonymous namespace)::registry()::r", "process",
     "the dataset registry (build time)"),
    ("src/core/config_presets.cpp", "titan::(anonymous namespace)::registry()::r", "process",
     "config presets (parse time)"),
    ("src/core/config_presets.cpp", "titan::(anonymous namespace)::registry()::builtins", "process",
     "registers the built-in presets once"),
    ("src/core/test_faults.cpp", "titan::testing::(anonymous namespace)::holder()::h", "process",
     "the test-only fault seam (set by tests, read between steps)"),
    # init
    ("src/nn/init.cpp", "titan::nn::(anonymous namespace)::thread_seed", "init",
     "manual_init_seed: the seed InitSite::current() names streams with"),
    # const: built once, never written
    ("src/core/cpu_info.cpp", "titan::cpu_info()::info", "const", "the CPU's description, read once"),
    ("src/core/config_presets.cpp", "titan::(anonymous namespace)::k8B", "const", "the 8B recipe preset's row"),
    ("src/core/config_support.cpp", "titan::config_detail::(anonymous namespace)::unsupported_table()::rows", "const",
     "torchtitan keys titan accepts and ignores, with why"),
    ("src/core/config.cpp", "titan::config_keys()::keys", "const", "every config key, for suggestions"),
    ("src/data/unicode.cpp", "titan::data::detail::(anonymous namespace)::bmp_table()::table", "const",
     "the Basic Multilingual Plane's character classes"),
    ("src/checkpoint/checkpoint.cpp", "titan::checkpoint::list_steps()::step_re", "const",
     "a checkpoint folder's name"),
    ("src/checkpoint/checkpointer.cpp", "titan::checkpoint::Checkpointer::Impl::purge()::tmp_re", "const",
     "an unfinished checkpoint folder's name"),
    ("src/optim/adam_bf16_states.cpp", "titan::detail::(anonymous namespace)::widest_kernel()::chosen", "const",
     "the bf16-moment Adam step's build for this CPU; its builds agree bitwise (tests/optim/adamw_test.cpp)"),
    ("src/float8/cast.cpp", "titan::float8::(anonymous namespace)::widest_kernels()::chosen", "const",
     "the float8 casts' build for this CPU; every build gives the reference's bytes (tests/float8/cast_test.cpp)"),
    ("src/models/llama3/args.cpp", "titan::llama3::(anonymous namespace)::flavors()::table", "const", "flavors"),
    ("src/models/qwen3/args.cpp", "titan::qwen3::(anonymous namespace)::flavors()::table", "const", "flavors"),
    ("src/models/deepseek_v3/args.cpp", "titan::deepseek_v3::(anonymous namespace)::flavors()::table", "const",
     "flavors"),
    ("src/models/gpt_oss/args.cpp", "titan::gpt_oss::(anonymous namespace)::flavors()::table", "const", "flavors"),
    ("src/models/qwen3_5/args.cpp", "titan::qwen3_5::(anonymous namespace)::dense_flavors()::table", "const",
     "flavors"),
    ("src/models/qwen3_5/args.cpp", "titan::qwen3_5::(anonymous namespace)::moe_flavors()::table", "const",
     "flavors"),
    ("src/models/llama3/hf_adapter.cpp",
     "titan::llama3::(anonymous namespace)::Llama3HfAdapter::hf_name()::block_re", "const", "an HF layer name"),
    ("src/models/qwen3/hf_adapter.cpp",
     "titan::qwen3::(anonymous namespace)::Qwen3HfAdapter::block_of()::block_re", "const", "an HF layer name"),
    ("src/models/deepseek_v3/hf_adapter.cpp",
     "titan::deepseek_v3::(anonymous namespace)::DeepSeekV3HfAdapter::split_block()::block_re", "const",
     "an HF layer name"),
    ("src/models/deepseek_v3/hf_adapter.cpp",
     "titan::deepseek_v3::(anonymous namespace)::DeepSeekV3HfAdapter::split_block()::mtp_block_re", "const",
     "a titan MTP block name"),
    ("src/models/deepseek_v3/hf_adapter.cpp",
     "titan::deepseek_v3::(anonymous namespace)::DeepSeekV3HfAdapter::mtp_own_name()::own_re", "const",
     "a titan MTP depth's own weight name"),
    ("src/models/gpt_oss/hf_adapter.cpp",
     "titan::gpt_oss::(anonymous namespace)::GptOssHfAdapter::find()::block_re", "const", "an HF layer name"),
    ("src/models/qwen3_5/hf_adapter.cpp",
     "titan::qwen3_5::(anonymous namespace)::Qwen35HfAdapter::find()::block_re", "const", "an HF layer name"),
]
# Model code may hold registries and constants: what it reads when a model is built, never in its forward.
MODEL_DIRS = ("src/models/", "include/titan/models/")
MODEL_ALLOWED_KINDS = {"process", "const"}
# Namespaces of the libraries whose headers the library includes: their inline variables and statics are
# theirs (ATen's dispatch tables, fmt's locale facet id, libstdc++'s regex tables, ...).
FOREIGN = ("std", "__gnu_cxx", "__cxxabiv1", "c10", "c10d", "at", "torch", "caffe2", "fmt", "nlohmann", "toml",
           "gloo", "google", "sentencepiece", "kineto", "libkineto", "dnnl", "ideep", "cub", "thrust", "cuda")
# The programs' own helpers (benchmarks/*.hpp), not the library's headers.
PROGRAM_NAMESPACES = ("titan::bench::",)
# Sections that stay writable while the program runs ("*COM*": a tentative definition, C's common block).
WRITABLE = re.compile(r"^(\.data|\.bss|\.tdata|\.tbss)(\..*)?$|^\*COM\*$")
READ_ONLY = re.compile(r"^\.data\.rel\.ro(\..*)?$")
# The compiler's names for one variable's companions; each stands for the variable.
COMPANION = re.compile(r"^(guard variable for |reference temporary #\d+ for )")
# vtables and typeinfo are written only by the loader's relocations (into .data.rel.ro under -fPIC, .data
# without it): their names say so.
IMMUTABLE = re.compile(r"^(vtable for |VTT for |construction vtable for |typeinfo for |typeinfo name for )")
# clang's global optimiser renames a variable it narrows ("x.0") and ThinLTO promotes ("x.llvm.123").
CLONE_SUFFIX = re.compile(r"(\.(\d+|llvm\.\d+|constprop\.\d+))+$")

Symbol = namedtuple("Symbol", "source object section size local mangled program")
Found = namedtuple("Found", "name sources section size local")


def fail(message):
    print(f"[check_ambient_state] {message}", file=sys.stderr)
    sys.exit(2)


def compile_entries(build):
    """(object path, source path) for every object compile_commands.json names."""
    commands = os.path.join(build, "compile_commands.json")
    if not os.path.exists(commands):
        fail(f"expected {commands}, got none. Configure the build (scripts/setup.sh) first.")
    pairs = []
    for entry in json.load(open(commands, encoding="utf-8")):
        output = entry.get("output")
        if output is None and "command" in entry:  # shlex only for a quoted path: it takes seconds over them all
            plain = re.search(r"\s-o\s+([^\s'\"]+)(\s|$)", entry["command"])
            output = plain.group(1) if plain else None
        if output is None:
            args = shlex.split(entry["command"]) if "command" in entry else entry["arguments"]
            output = args[args.index("-o") + 1]
        pairs.append((os.path.normpath(os.path.join(entry["directory"], output)), entry["file"]))
    return pairs


def library_objects(build):
    """(object path, source path) for every object of libtitan.a, checked against the archive and the sources."""
    # titan's own objects, its CUDA glue's and its gRPC client's (object libraries of their own: CMakeLists.txt says
    # why).
    parts = ("/CMakeFiles/titan.dir/", "/CMakeFiles/titan_cuda.dir/", "/CMakeFiles/titan_grpc.dir/")
    pairs = [(obj, src) for obj, src in compile_entries(build) if any(p in obj.replace(os.sep, "/") for p in parts)]
    archive = os.path.join(build, "libtitan.a")
    if not pairs or not os.path.exists(archive):
        fail(f"expected {archive} and its objects, got none. Build it: cmake --build {build} --target titan")
    members = sorted(subprocess.run(["ar", "t", archive], check=True, capture_output=True,
                                    text=True).stdout.split())
    named = sorted(os.path.basename(obj) for obj, _ in pairs)
    if members != named:
        fail(f"expected {archive} to hold the objects compile_commands.json names, got {len(members)} members for "
             f"{len(named)} objects. Rebuild it: cmake --build {build} --target titan")
    for obj, src in pairs:
        if not os.path.exists(obj) or os.path.getmtime(obj) < os.path.getmtime(src):
            got = "an older one" if os.path.exists(obj) else "none"
            fail(f"expected {obj} built from the current {src}, got {got}. Rebuild it: cmake --build {build} "
                 "--target titan")
    return pairs


def program_objects(build, root):
    """(object path, source path) of the built programs (examples, tools, benchmarks): where the library's
    header templates are instantiated, so where their inline state is emitted. Tests are not the library."""
    programs = tuple(os.path.join(root, d) + os.sep for d in ("examples", "tools", "benchmarks"))
    return [(obj, src) for obj, src in compile_entries(build) if src.startswith(programs) and os.path.exists(obj)]


def read_symbols(pairs, root, program=False):
    """Every symbol of a writable section in the objects, from one objdump run. A program's symbols count only
    where they are the library's headers' inline state: titan's, emitted as COMDAT (weak or unique)."""
    if not pairs:
        return []
    listing = subprocess.run(["objdump", "-t", "-w"] + [obj for obj, _ in pairs], check=True, capture_output=True,
                             text=True).stdout
    source_of = {obj: os.path.relpath(src, root).replace(os.sep, "/") for obj, src in pairs}
    for _, src in pairs:
        batch_members(src, root)
    line_re = re.compile(r"^[0-9a-f]+ (.{7}) (\S+)\t([0-9a-f]+)\s+(?:\.hidden |\.protected |\.internal )?(\S+)$")
    symbols, current = [], None
    for line in listing.splitlines():
        if "file format" in line:
            header = re.match(r"^(.*):\s+file format \S+$", line)
            current = header.group(1) if header else current
            continue
        if " .data" not in line and " .bss" not in line and " .t" not in line and "*COM*" not in line:
            continue
        m = line_re.match(line)
        if not m or current is None:
            continue
        flags, section, size, name = m.groups()
        # flags: binding (l, g, u, !), weak, constructor, warning, indirect, debugging (d), type (F, f, O)
        if flags[5] in "dD" or flags[6] in "Ff" or not WRITABLE.match(section) or READ_ONLY.match(section):
            continue
        if program and not (flags[1] == "w" or flags[0] == "u"):
            continue
        symbols.append(Symbol(source_of[current], current, section, int(size, 16), flags[0] == "l", name, program))
    return symbols


def demangle(names):
    if not names:
        return []
    out = subprocess.run(["c++filt"], input="\n".join(names) + "\n", check=True, capture_output=True,
                         text=True).stdout.splitlines()
    if len(out) != len(names):
        fail(f"expected c++filt to demangle {len(names)} names, got {len(out)} lines.")
    return out


def simplify(name):
    """A demangled name without what differs between compilers and overloads: parameter lists, ABI tags,
    lambda numbering and cv-qualifiers of member functions."""
    name = name.replace("[abi:cxx11]", "")
    name = re.sub(r"\{lambda\([^)]*\)#\d+\}|\$_\d+|'lambda\d*'\([^)]*\)", "{lambda}", name)
    out, depth, i = [], 0, 0
    while i < len(name):
        if depth == 0 and name.startswith("(anonymous namespace)", i):
            out.append("(anonymous namespace)")
            i += len("(anonymous namespace)")
            continue
        c = name[i]
        if c == "(":
            if depth == 0:
                out.append("(")
            depth += 1
        elif c == ")":
            depth -= 1
            if depth == 0:
                out.append(")")
        elif depth == 0:
            out.append(c)
        i += 1
    return re.sub(r"\)( const| volatile| &&| &)+", ")", "".join(out))


# A batch file (cmake/TitanBatches.cmake) -> the sources it includes, relative to the root.
BATCHES = {}


def batch_members(src, root):
    """Records the sources of a batch file, whose object holds the state of all of them."""
    rel = os.path.relpath(src, root).replace(os.sep, "/")
    if rel in BATCHES or not re.search(r"/batches/[^/]+/batch_\d+\.cpp$", rel):
        return
    folder = os.path.dirname(src)
    text = open(src, encoding="utf-8").read()
    BATCHES[rel] = [os.path.relpath(os.path.normpath(os.path.join(folder, inc)), root).replace(os.sep, "/")
                    for inc in re.findall(r'^#include "([^"]+)"', text, re.M)]


def member_source(source, name, root):
    """The source of a batch that declares `name`: the member naming most of its last components (a variable,
    and the function or class around it)."""
    members = BATCHES.get(source)
    if not members:
        return source
    # A component followed by "(" is a function: the member must define it, not only call it.
    parts = [(m.group(1), m.group(2) == "(") for m in re.finditer(r"([A-Za-z_]\w*)(\()?", name)]
    def score(member):
        text = open(os.path.join(root, member), encoding="utf-8").read()
        text = re.sub(r'//[^\n]*|/\*.*?\*/|"(?:\\.|[^"\\\n])*"', " ", text, flags=re.S)  # code only
        total = 0
        for i, (part, function) in enumerate(parts):
            pattern = r"\b" + re.escape(part) + (r"\s*\([^;{}]*\)[^;{}]*\{" if function else r"\b")
            total += 2 ** i if re.search(pattern, text) else 0
        return total
    return max(members, key=score)


def ambient(symbols, root=None):
    """name -> Found, one per piece of the library's writable state (its companions folded in)."""
    mangled = [CLONE_SUFFIX.sub("", s.mangled) for s in symbols]
    found = {}
    for sym, plain in zip(symbols, demangle(mangled)):
        if IMMUTABLE.match(plain):
            continue
        name = simplify(COMPANION.sub("", plain))
        if name.startswith(("__", ".", "DW.ref.")) or name.split("::", 1)[0] in FOREIGN:
            continue
        if sym.program and (not name.startswith("titan::") or name.startswith(PROGRAM_NAMESPACES)):
            continue
        if root is not None and sym.source in BATCHES:
            sym = sym._replace(source=member_source(sym.source, name, root))
        key = (sym.source if sym.local else "", name)
        have = found.get(key)
        tls = sym.section.startswith((".tbss", ".tdata"))
        if have is None:
            found[key] = Found(name, [sym.source], sym.section, sym.size, sym.local)
        else:
            if sym.source not in have.sources:
                have.sources.append(sym.source)
            if tls or COMPANION.match(plain) is None:  # the variable's own section and size, not its guard's
                found[key] = have._replace(section=sym.section, size=sym.size)
    return found


def what(found):
    if found.section.startswith((".tbss", ".tdata")):
        return "thread_local"
    if re.search(r"\)::", found.name.replace("(anonymous namespace)", "")):
        return "function-local static"
    return "variable" if found.local else "variable with external linkage"


def declared_const(path, name):
    """Whether `path` declares the last component of `name` const: `const T name`, `const T& name` or
    `T* const name`, never `const T* name` (a pointer to const is itself writable)."""
    leaf = re.escape(name.rsplit("::", 1)[-1])
    text = open(path, encoding="utf-8").read()
    for m in re.finditer(r"(?:^|[;{}])([^;{}()=\n]*?)\b" + leaf + r"\s*(?:=|\{|\(|;)", text, re.M):
        declared = m.group(1)
        pointer = declared.rfind("*")
        if re.search(r"\bconst\b", declared[pointer + 1:] if pointer >= 0 else declared):
            return True
    return False


def matches(row, item):
    source, name = row[0], row[1]
    if name != item.name:
        return False
    return source in item.sources or (not item.local and source.endswith((".hpp", ".h", ".inc")))


def check(found, table, root, read_path=None, stale_from=0):
    """The problems of `found` against `table`; rows from `stale_from` on must each match something."""
    read_path = read_path or {}
    problems, used = [], set()
    for key in sorted(found):
        item = found[key]
        rows = [i for i, row in enumerate(table) if matches(row, item)]
        where = ", ".join(item.sources[:3]) + (f" and {len(item.sources) - 3} more" if len(item.sources) > 3 else "")
        if not rows:
            foreign = item.name.split("::", 1)[0]
            hint = (f" If {foreign}:: is a library the headers include, add it to FOREIGN."
                    if "::" in item.name and foreign not in ("titan", "(anonymous namespace)") else "")
            problems.append(
                f"{where}: {item.name} ({what(item)} in {item.section}, {item.size} bytes): ambient state nobody "
                "accounted for. Pass it to what reads it (an argument, the attention context, parallel::WeightUse), "
                "make it const or constexpr, or add it to TABLE in scripts/check_ambient_state.py with its kind and "
                "why a forward's result cannot depend on it." + hint)
            continue
        used.update(rows)
        source, name, kind, _ = table[rows[0]]
        if kind not in KINDS:
            problems.append(f"{source}: {name}: kind '{kind}' is none of {', '.join(KINDS)}.")
        if source.startswith(MODEL_DIRS) and kind not in MODEL_ALLOWED_KINDS:
            problems.append(f"{source}: {name}: model code holds {kind} state; models take what they read as "
                            "arguments (registries and constants only).")
        path = read_path.get(source, os.path.join(root, source))
        if kind == "const" and not declared_const(path, name):
            problems.append(f"{source}: {name}: listed as const in scripts/check_ambient_state.py, but {source} "
                            "does not declare it const. Declare it const, or list it with the kind of state it is.")
    for i, (source, name, _, _) in enumerate(table):
        if i >= stale_from and i not in used:
            problems.append(f"{source}: {name}: listed in scripts/check_ambient_state.py but not in the library's "
                            "objects; remove it from TABLE.")
    return problems


# ---- the probe: one declaration of each form, compiled with the library's own flags ---------------------------
# (form, declaration, a statement that writes and reads it, the name the check must report). Each is used by an
# exported function, so the optimiser keeps it.
PROBE_FORMS = [
    ("namespace-static-double", "static double probe_static_double = 1.0;",
     "probe_static_double += x; return probe_static_double;", "titan::nn::probe_static_double"),
    ("namespace-extern-int", "int probe_extern_int = 0;", "probe_extern_int += int(x); return probe_extern_int;",
     "titan::nn::probe_extern_int"),
    ("namespace-tensor", "at::Tensor probe_tensor;",
     "probe_tensor = at::full({1}, x); return probe_tensor.item<double>();",
     "titan::nn::probe_tensor"),
    ("namespace-atomic", "std::atomic<int> probe_atomic{0};", "return probe_atomic.fetch_add(int(x));",
     "titan::nn::probe_atomic"),
    ("namespace-user-type", "struct ProbeCounter { int64_t n = 0; std::string last; };\nProbeCounter probe_user_type;",
     "probe_user_type.last = std::to_string(x); return double(++probe_user_type.n);", "titan::nn::probe_user_type"),
    ("anonymous-namespace", "namespace {\nint probe_anonymous = 0;\n}",
     "probe_anonymous += int(x); return probe_anonymous;", "titan::nn::(anonymous namespace)::probe_anonymous"),
    ("global-namespace", "}  // namespace titan::nn\nstatic long probe_global_namespace = 0;\nnamespace titan::nn {",
     "probe_global_namespace += long(x); return double(probe_global_namespace);", "probe_global_namespace"),
    ("static-inline-member", "struct ProbeSettings { static inline int probe_inline_member = 3; };",
     "ProbeSettings::probe_inline_member += int(x); return ProbeSettings::probe_inline_member;",
     "titan::nn::ProbeSettings::probe_inline_member"),
    ("static-member",
     "struct ProbeOld { static double probe_static_member; };\ndouble ProbeOld::probe_static_member = 4;",
     "ProbeOld::probe_static_member *= x; return ProbeOld::probe_static_member;",
     "titan::nn::ProbeOld::probe_static_member"),
    ("inline-variable", "inline std::vector<double> probe_inline_variable;",
     "probe_inline_variable.push_back(x); return double(probe_inline_variable.size());",
     "titan::nn::probe_inline_variable"),
    ("variable-template", "template <class T>\nT probe_variable_template = T(1);",
     "probe_variable_template<double> += x; return probe_variable_template<double>;",
     "titan::nn::probe_variable_template<double>"),
    ("pointer-to-const", "const char* probe_pointer_to_const = \"a\";",
     "probe_pointer_to_const = x > 0 ? \"b\" : \"c\"; return double(*probe_pointer_to_const);",
     "titan::nn::probe_pointer_to_const"),
    ("thread-local", "thread_local int probe_thread_local = 0;",
     "probe_thread_local += int(x); return probe_thread_local;", "titan::nn::probe_thread_local"),
    ("thread-local-dynamic", "thread_local std::vector<double> probe_thread_local_vector(2);",
     "probe_thread_local_vector.push_back(x); return double(probe_thread_local_vector.size());",
     "titan::nn::probe_thread_local_vector"),
    ("function-static", "",
     "static int probe_function_static = 0; probe_function_static += int(x); return probe_function_static;",
     "titan::nn::use_function_static()::probe_function_static"),
    ("function-static-guarded", "",
     "static std::string probe_function_string = std::to_string(x); probe_function_string += 'a';"
     " return double(probe_function_string.size());",
     "titan::nn::use_function_static_guarded()::probe_function_string"),
    ("function-static-thread-local", "",
     "static thread_local double probe_function_thread_local = 0; probe_function_thread_local += x;"
     " return probe_function_thread_local;",
     "titan::nn::use_function_static_thread_local()::probe_function_thread_local"),
    ("lambda-static", "",
     "auto f = [](double y) { static double probe_lambda_static = 0; return probe_lambda_static += y; };"
     " return f(x);",
     "titan::nn::use_lambda_static()::{lambda}::operator()()::probe_lambda_static"),
    ("member-function-static", "struct ProbeLayer { double forward(double x); };\n"
     "double ProbeLayer::forward(double x) { static double probe_member_static = 0; return probe_member_static += x; }",
     "return ProbeLayer{}.forward(x);", "titan::nn::ProbeLayer::forward()::probe_member_static"),
]
PROBE_SOURCE = "src/nn/ambient_state_probe.cpp"  # where the check places the probe's symbols
PROBE_MODEL_SOURCE = "src/models/ambient_state_probe.cpp"
# Probes of the table's own rules: (form, extra TABLE row, probe source, text the problem must contain).
PROBE_RULES = [
    ("model-state", (PROBE_MODEL_SOURCE, "titan::nn::probe_static_double", "mode", "probe"), PROBE_MODEL_SOURCE,
     "model code holds mode state"),
    ("const-not-const", (PROBE_SOURCE, "titan::nn::probe_pointer_to_const", "const", "probe"), PROBE_SOURCE,
     "does not declare it const"),
    ("stale-row", (PROBE_SOURCE, "titan::nn::probe_removed", "observe", "probe"), PROBE_SOURCE,
     "titan::nn::probe_removed: listed in scripts/check_ambient_state.py but not in the library's objects"),
]


def form_function(form):
    return "use_" + form.replace("-", "_")


def probe_text():
    lines = ["// Generated by scripts/check_ambient_state.py: one declaration of each form the check must catch.",
             "#include <ATen/ATen.h>", "", "#include <atomic>", "#include <string>", "#include <vector>", "",
             "namespace titan::nn {"]
    for form, declaration, body, _ in PROBE_FORMS:
        lines += [declaration, f"double {form_function(form)}(double x) {{ {body} }}", ""]
    lines.append("}  // namespace titan::nn")
    return "\n".join(lines) + "\n"


def compile_probe(build, folder):
    """Compiles the probe with the compile command of a library source (its flags, its precompiled header)."""
    entries = json.load(open(os.path.join(build, "compile_commands.json"), encoding="utf-8"))
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    for e in entries:
        batch_members(e["file"], root)
    def holds_attention(e):
        rel = os.path.relpath(e["file"], root).replace(os.sep, "/")
        return rel == "src/nn/attention.cpp" or "src/nn/attention.cpp" in BATCHES.get(rel, [])
    model = next((e for e in entries if holds_attention(e)), None)
    if model is None:
        fail(f"expected src/nn/attention.cpp in {build}/compile_commands.json, got none.")
    os.makedirs(folder, exist_ok=True)
    source = os.path.abspath(os.path.join(folder, "probe.cpp"))
    obj = os.path.abspath(os.path.join(folder, "probe.o"))
    with open(source, "w", encoding="utf-8") as f:
        f.write(probe_text())
    args = shlex.split(model["command"]) if "command" in model else list(model["arguments"])
    args[args.index("-o") + 1] = obj
    args[args.index("-c") + 1] = source
    args = [a for a in args if a != "-Werror"]  # CI's -Werror: a warning about the probe's globals is no failure
    done = subprocess.run(args, cwd=model["directory"], capture_output=True, text=True)
    if done.returncode != 0:
        print(done.stdout + done.stderr)
        fail(f"expected the probe to compile, got exit status {done.returncode}.")
    print(f"probe compiled: {obj} ({len(PROBE_FORMS)} forms)")


def run_probe(build, root, folder, expect):
    forms = {f: name for f, _, _, name in PROBE_FORMS}
    rules = {f: (row, source, text) for f, row, source, text in PROBE_RULES}
    if expect not in forms and expect not in rules:
        fail(f"expected a form among {', '.join(list(forms) + list(rules))}, got '{expect}'.")
    obj = os.path.abspath(os.path.join(folder, "probe.o"))
    source_path = os.path.abspath(os.path.join(folder, "probe.cpp"))
    if not os.path.exists(obj):
        fail(f"expected the probe object {obj}, got none. Compile it: scripts/check_ambient_state.py --build {build} "
             f"--compile-probe {folder}")
    # The probe alone against the whole table (whose rows the library's own check holds to the library).
    table = list(TABLE)
    source = PROBE_SOURCE
    if expect in rules:
        row, source, text = rules[expect]
        table.append(row)
    else:
        text = f"{PROBE_SOURCE}: {forms[expect]} ("
    probe = [s._replace(source=source) for s in read_symbols([(obj, source_path)], root)]
    problems = check(ambient(probe), table, root, read_path={source: source_path}, stale_from=len(TABLE))
    outside = [p for p in problems if "ambient_state_probe" not in p]
    hit = [p for p in problems if text in p]
    print("\n".join(hit) if hit else f"expected a problem containing '{text}', got:\n" + "\n".join(problems))
    if outside:
        print("problems outside the probe:\n" + "\n".join(outside))
    return 0 if hit and not outside else 1


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    here = os.path.dirname(os.path.abspath(__file__))
    parser.add_argument("--root", default=os.path.join(here, ".."), help="the repository (default: this script's)")
    parser.add_argument("--build", help="the build folder (default: ROOT/build)")
    parser.add_argument("--compile-probe", metavar="FOLDER", help="compile the probe into FOLDER")
    parser.add_argument("--probe", metavar="FOLDER", help="with --expect: check the library plus FOLDER's probe")
    parser.add_argument("--expect", metavar="FORM", help="the probe form whose declaration must be caught")
    parser.add_argument("--list-forms", action="store_true", help="list the probe's forms")
    args = parser.parse_args()
    root = os.path.abspath(args.root)
    build = os.path.abspath(args.build or os.path.join(root, "build"))
    if args.list_forms:
        print("\n".join([f for f, _, _, _ in PROBE_FORMS] + [f for f, _, _, _ in PROBE_RULES]))
        return 0
    if args.compile_probe:
        compile_probe(build, args.compile_probe)
        return 0
    if args.probe or args.expect:
        if not (args.probe and args.expect):
            fail("expected --probe FOLDER and --expect FORM together.")
        return run_probe(build, root, args.probe, args.expect)
    library, programs = library_objects(build), program_objects(build, root)
    found = ambient(read_symbols(library, root) + read_symbols(programs, root, program=True), root)
    problems = check(found, TABLE, root)
    if problems:
        print("\n".join(problems))
        return 1
    kinds = {}
    for _, _, kind, _ in TABLE:
        kinds[kind] = kinds.get(kind, 0) + 1
    print(f"ambient state of {build}/libtitan.a ({len(library)} objects; the headers' inline state "
          f"through {len(programs)} program objects) accounted for: " +
          ", ".join(f"{n} {k}" for k, n in sorted(kinds.items())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
