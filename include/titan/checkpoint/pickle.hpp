// SPDX-License-Identifier: BSD-3-Clause
// Python pickles as data: a reader of the protocol 2-5 opcodes torch.distributed.checkpoint's `.metadata` and
// torch.save's data.pkl use, which builds a tree of values and never runs anything (a class is a name, a call is
// its callee and arguments), and refuses every GLOBAL the caller does not allow, by name; and a writer of the
// same trees (protocol 2) that Python's pickle.load reads back.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace titan::checkpoint {

struct PyValue;
using PyRef = std::shared_ptr<PyValue>;

/// One Python value of a pickle.
struct PyValue {
  enum class Kind { kNone, kBool, kInt, kFloat, kStr, kBytes, kList, kTuple, kDict, kGlobal, kCall, kPersistentId };
  Kind kind = Kind::kNone;
  bool boolean = false;        ///< kBool
  int64_t integer = 0;         ///< kInt
  double real = 0;             ///< kFloat
  std::string text{};          ///< kStr, kBytes; kGlobal: "module.name"
  std::vector<PyRef> items{};  ///< kList, kTuple; kCall: its arguments; kPersistentId: its id (one value)
  std::vector<std::pair<PyRef, PyRef>> entries{};  ///< kDict, in insertion order
  PyRef callee{};                                  ///< kCall: the class or function (a kGlobal)
  PyRef state{};                                   ///< kCall: what BUILD gave it (null when none)
  bool new_object = false;                         ///< kCall: made by NEWOBJ (cls.__new__), not REDUCE

  /// The callee's "module.name" of a kCall, else "".
  std::string class_name() const;
  /// A dict's value under a str key, or null.
  PyRef get(std::string_view key) const;
  /// A short description for error messages ("int 3", "str 'x'", "torch.Size(...)").
  std::string describe() const;
};

PyRef py_none();
PyRef py_bool(bool v);
PyRef py_int(int64_t v);
PyRef py_float(double v);
PyRef py_str(std::string v);
PyRef py_list(std::vector<PyRef> items);
PyRef py_tuple(std::vector<PyRef> items);
PyRef py_dict(std::vector<std::pair<PyRef, PyRef>> entries);
PyRef py_global(const std::string& qualified);  ///< "module.name" (the last dot splits them)
/// A REDUCE (new_object false: callee(*args)) or NEWOBJ + BUILD (callee.__new__(callee, *args), then state).
PyRef py_call(PyRef callee, std::vector<PyRef> args, PyRef state = nullptr, bool new_object = false);

/// Decides which GLOBAL (module, name) a pickle may name.
using GlobalFilter = std::function<bool(const std::string& module, const std::string& name)>;

/// The value a pickle holds. `what` names the input in errors; a GLOBAL that `allowed` refuses, an opcode outside
/// protocols 2-5's data subset, BINPERSID (unless `persistent` is set) or truncated or malformed bytes are each a
/// c10::ValueError `[titan::checkpoint::unpickle] expected ..., got ... in <what>`.
PyRef unpickle(std::string_view bytes, const GlobalFilter& allowed, const std::string& what, bool persistent = false);

/// The pickle (protocol 2) of a tree of None, bool, int, float, str, list, tuple, dict, global and call values.
std::string pickle(const PyValue& value);

}  // namespace titan::checkpoint
