// SPDX-License-Identifier: BSD-3-Clause
// Opcodes as Python's Lib/pickletools.py documents them; only the data subset protocols 2-5 write for dicts,
// lists, tuples, scalars, strings, globals and object construction (no INST/OBJ, no extension registry, no
// out-of-band buffers).
#include "titan/checkpoint/pickle.hpp"

#include <fmt/format.h>

#include <bit>
#include <cstring>
#include <limits>

#include "titan/core/error.hpp"

namespace titan::checkpoint {
namespace {

PyRef make_py(PyValue::Kind kind) {
  auto v = std::make_shared<PyValue>();
  v->kind = kind;
  return v;
}

// The stack machine. Memo entries share their nodes with the stack, so APPEND/SETITEMS on a memoized list or
// dict change it everywhere it is referenced, as in Python.
class Unpickler {
 public:
  Unpickler(std::string_view bytes, const GlobalFilter& allowed, const std::string& what, bool persistent)
      : in_(bytes), allowed_(allowed), what_(what), persistent_(persistent) {}

  PyRef run() {
    while (true) {
      const size_t at = pos_;
      const auto op = static_cast<uint8_t>(take(1)[0]);
      switch (op) {
        case 0x80: {  // PROTO
          const auto proto = static_cast<uint8_t>(take(1)[0]);
          if (proto < 2 || proto > 5) refuse(at, "pickle protocol 2 to 5", fmt::format("protocol {}", proto));
          break;
        }
        case 0x95:
          take(8);
          break;     // FRAME: a length hint only
        case '.': {  // STOP
          if (stack_.size() != 1 || !marks_.empty())
            refuse(at, "one value on the stack at STOP", fmt::format("{} values", stack_.size()));
          return stack_.back();
        }
        case '(':
          marks_.push_back(stack_.size());
          break;  // MARK
        case '0':
          pop(at);
          break;  // POP
        case '1':
          pop_mark(at);
          break;  // POP_MARK
        case '2':
          push(top(at));
          break;  // DUP
        case 0x94:
          memo_.push_back(top(at));
          break;  // MEMOIZE
        case 'q':
          put(at, u8());
          break;  // BINPUT
        case 'r':
          put(at, u32());
          break;  // LONG_BINPUT
        case 'h':
          get(at, u8());
          break;  // BINGET
        case 'j':
          get(at, u32());
          break;  // LONG_BINGET
        case 'N':
          push(make_py(PyValue::Kind::kNone));
          break;
        case 0x88:
          push(py_bool(true));
          break;  // NEWTRUE
        case 0x89:
          push(py_bool(false));
          break;  // NEWFALSE
        case 'J':
          push(py_int(static_cast<int32_t>(u32())));
          break;
        case 'K':
          push(py_int(u8()));
          break;
        case 'M':
          push(py_int(u16()));
          break;
        case 0x8a:
          push(long_int(at, u8()));
          break;  // LONG1
        case 0x8b:
          push(long_int(at, u32()));
          break;     // LONG4
        case 'G': {  // BINFLOAT: big-endian double
          uint64_t bits = 0;
          for (char c : take(8)) bits = (bits << 8) | static_cast<uint8_t>(c);
          push(py_float(std::bit_cast<double>(bits)));
          break;
        }
        case 0x8c:
          push(py_str(std::string(take(u8()))));
          break;  // SHORT_BINUNICODE
        case 'X':
          push(py_str(std::string(take(u32()))));
          break;  // BINUNICODE
        case 0x8d:
          push(py_str(std::string(take(u64(at)))));
          break;  // BINUNICODE8
        case 'C':
          push(bytes(take(u8())));
          break;  // SHORT_BINBYTES
        case 'B':
          push(bytes(take(u32())));
          break;  // BINBYTES
        case 0x8e:
          push(bytes(take(u64(at))));
          break;  // BINBYTES8
        case ')':
          push(py_tuple({}));
          break;  // EMPTY_TUPLE
        case 't':
          push(py_tuple(pop_mark(at)));
          break;  // TUPLE
        case 0x85:
        case 0x86:
        case 0x87: {  // TUPLE1..3
          const size_t n = op - 0x84u;
          if (stack_.size() < n + floor()) refuse(at, fmt::format("{} values for a tuple", n), "fewer");
          std::vector<PyRef> items(stack_.end() - static_cast<std::ptrdiff_t>(n), stack_.end());
          stack_.resize(stack_.size() - n);
          push(py_tuple(std::move(items)));
          break;
        }
        case ']':
          push(py_list({}));
          break;     // EMPTY_LIST
        case 'a': {  // APPEND
          PyRef v = pop(at);
          container(at, PyValue::Kind::kList)->items.push_back(std::move(v));
          break;
        }
        case 'e': {  // APPENDS
          std::vector<PyRef> vs = pop_mark(at);
          auto& items = container(at, PyValue::Kind::kList)->items;
          items.insert(items.end(), vs.begin(), vs.end());
          break;
        }
        case '}':
          push(py_dict({}));
          break;     // EMPTY_DICT
        case 's': {  // SETITEM
          PyRef v = pop(at), k = pop(at);
          container(at, PyValue::Kind::kDict)->entries.emplace_back(std::move(k), std::move(v));
          break;
        }
        case 'u': {  // SETITEMS
          std::vector<PyRef> kv = pop_mark(at);
          if (kv.size() % 2 != 0) refuse(at, "key-value pairs for SETITEMS", fmt::format("{} values", kv.size()));
          auto& entries = container(at, PyValue::Kind::kDict)->entries;
          for (size_t i = 0; i < kv.size(); i += 2) entries.emplace_back(kv[i], kv[i + 1]);
          break;
        }
        case 'c': {  // GLOBAL: "module\nname\n"
          const std::string module = line(at), name = line(at);
          push(global(at, module, name));
          break;
        }
        case 0x93: {  // STACK_GLOBAL
          PyRef name = pop(at), module = pop(at);
          if (module->kind != PyValue::Kind::kStr || name->kind != PyValue::Kind::kStr)
            refuse(at, "two str for STACK_GLOBAL", module->describe() + ", " + name->describe());
          push(global(at, module->text, name->text));
          break;
        }
        case 'R':     // REDUCE
        case 0x81: {  // NEWOBJ
          PyRef args = pop(at), callee = pop(at);
          if (callee->kind != PyValue::Kind::kGlobal || args->kind != PyValue::Kind::kTuple)
            refuse(at, "a global and an argument tuple", callee->describe() + ", " + args->describe());
          push(py_call(callee, args->items, nullptr, op == 0x81));
          break;
        }
        case 'b': {  // BUILD
          PyRef state = pop(at);
          PyRef obj = top(at);
          if (obj->kind != PyValue::Kind::kCall || obj->state != nullptr)
            refuse(at, "a newly made object for BUILD", obj->describe());
          obj->state = std::move(state);
          break;
        }
        case 'Q': {  // BINPERSID
          PyRef id = pop(at);
          if (!persistent_) refuse(at, "no persistent id (BINPERSID)", id->describe());
          PyRef v = make_py(PyValue::Kind::kPersistentId);
          v->items.push_back(std::move(id));
          push(std::move(v));
          break;
        }
        default:
          refuse(at, "an opcode of pickle's data subset (protocols 2-5)", fmt::format("opcode 0x{:02x}", op));
      }
    }
  }

 private:
  [[noreturn]] void refuse(size_t at, const std::string& expected, const std::string& got) const {
    TITAN_CHECK_VALUE(false,
                      "[titan::checkpoint::unpickle] expected {}, got {} at byte {} of {}. The file is corrupt or not "
                      "what it claims to be; titan reads it as data and refuses anything else.",
                      expected, got, at, what_);
    std::abort();  // unreachable: the check above throws
  }
  std::string_view take(uint64_t n) {
    if (n > in_.size() - pos_) refuse(pos_, fmt::format("{} more bytes", n), "the end of the pickle");
    const std::string_view s = in_.substr(pos_, n);
    pos_ += n;
    return s;
  }
  uint64_t little(size_t n) {
    uint64_t v = 0;
    const std::string_view s = take(n);
    for (size_t i = 0; i < n; ++i) v |= static_cast<uint64_t>(static_cast<uint8_t>(s[i])) << (8 * i);
    return v;
  }
  uint32_t u8() { return static_cast<uint32_t>(little(1)); }
  uint32_t u16() { return static_cast<uint32_t>(little(2)); }
  uint32_t u32() { return static_cast<uint32_t>(little(4)); }
  uint64_t u64(size_t at) {
    const uint64_t v = little(8);
    if (v > in_.size()) refuse(at, "a length inside the pickle", fmt::format("{}", v));
    return v;
  }
  std::string line(size_t at) {
    const size_t end = in_.find('\n', pos_);
    if (end == std::string_view::npos) refuse(at, "a newline-terminated GLOBAL name", "the end of the pickle");
    std::string s(in_.substr(pos_, end - pos_));
    pos_ = end + 1;
    return s;
  }
  // Little-endian two's complement of n bytes; titan's values fit in 64 bits.
  PyRef long_int(size_t at, uint64_t n) {
    if (n > 8) refuse(at, "an integer of at most 8 bytes", fmt::format("{} bytes", n));
    const std::string_view s = take(n);
    uint64_t v = 0;
    for (size_t i = 0; i < n; ++i) v |= static_cast<uint64_t>(static_cast<uint8_t>(s[i])) << (8 * i);
    if (n > 0 && n < 8 && (static_cast<uint8_t>(s[n - 1]) & 0x80)) v |= ~uint64_t{0} << (8 * n);  // sign-extend
    return py_int(static_cast<int64_t>(v));
  }
  static PyRef bytes(std::string_view s) {
    PyRef v = make_py(PyValue::Kind::kBytes);
    v->text = std::string(s);
    return v;
  }
  PyRef global(size_t at, const std::string& module, const std::string& name) {
    if (!allowed_(module, name))
      refuse(at, "a class of the checkpoint format", fmt::format("GLOBAL '{}.{}' (refused by name)", module, name));
    return py_global(module + "." + name);
  }
  size_t floor() const { return marks_.empty() ? 0 : marks_.back(); }
  void push(PyRef v) { stack_.push_back(std::move(v)); }
  PyRef top(size_t at) {
    if (stack_.size() <= floor()) refuse(at, "a value on the stack", "an empty stack");
    return stack_.back();
  }
  PyRef pop(size_t at) {
    PyRef v = top(at);
    stack_.pop_back();
    return v;
  }
  std::vector<PyRef> pop_mark(size_t at) {
    if (marks_.empty()) refuse(at, "a MARK", "none");
    std::vector<PyRef> items(stack_.begin() + static_cast<std::ptrdiff_t>(marks_.back()), stack_.end());
    stack_.resize(marks_.back());
    marks_.pop_back();
    return items;
  }
  PyValue* container(size_t at, PyValue::Kind kind) {
    PyRef c = top(at);
    if (c->kind != kind) refuse(at, kind == PyValue::Kind::kList ? "a list" : "a dict", c->describe());
    return c.get();
  }
  void put(size_t at, uint32_t index) {
    if (index > memo_.size()) refuse(at, fmt::format("a memo index up to {}", memo_.size()), fmt::format("{}", index));
    if (index == memo_.size()) {
      memo_.push_back(top(at));
    } else {
      memo_[index] = top(at);
    }
  }
  void get(size_t at, uint32_t index) {
    if (index >= memo_.size()) refuse(at, fmt::format("a memo index below {}", memo_.size()), fmt::format("{}", index));
    push(memo_[index]);
  }

  std::string_view in_;
  size_t pos_ = 0;
  const GlobalFilter& allowed_;
  const std::string& what_;
  bool persistent_;
  std::vector<PyRef> stack_{};
  std::vector<size_t> marks_{};
  std::vector<PyRef> memo_{};
};

// ---- the writer -----------------------------------------------------------------------------------------

void pickle_put_le(std::string& out, uint64_t v, int n) {
  for (int i = 0; i < n; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

void pickle_value(std::string& out, const PyValue& v) {
  switch (v.kind) {
    case PyValue::Kind::kNone:
      out += 'N';
      break;
    case PyValue::Kind::kBool:
      out += static_cast<char>(v.boolean ? 0x88 : 0x89);
      break;
    case PyValue::Kind::kInt:
      if (v.integer >= 0 && v.integer < 256) {
        out += 'K';
        pickle_put_le(out, static_cast<uint64_t>(v.integer), 1);
      } else if (v.integer >= std::numeric_limits<int32_t>::min() && v.integer <= std::numeric_limits<int32_t>::max()) {
        out += 'J';
        pickle_put_le(out, static_cast<uint32_t>(static_cast<int32_t>(v.integer)), 4);
      } else {
        out += static_cast<char>(0x8a);  // LONG1, 8 bytes two's complement
        out += static_cast<char>(8);
        pickle_put_le(out, static_cast<uint64_t>(v.integer), 8);
      }
      break;
    case PyValue::Kind::kFloat: {
      out += 'G';
      const auto bits = std::bit_cast<uint64_t>(v.real);
      for (int i = 7; i >= 0; --i) out.push_back(static_cast<char>((bits >> (8 * i)) & 0xff));
      break;
    }
    case PyValue::Kind::kStr:
      out += 'X';
      pickle_put_le(out, v.text.size(), 4);
      out += v.text;
      break;
    case PyValue::Kind::kBytes:
      out += 'B';
      pickle_put_le(out, v.text.size(), 4);
      out += v.text;
      break;
    case PyValue::Kind::kList:
      out += ']';
      if (!v.items.empty()) {
        out += '(';
        for (const auto& item : v.items) pickle_value(out, *item);
        out += 'e';
      }
      break;
    case PyValue::Kind::kTuple:
      out += '(';
      for (const auto& item : v.items) pickle_value(out, *item);
      out += 't';
      break;
    case PyValue::Kind::kDict:
      out += '}';
      if (!v.entries.empty()) {
        out += '(';
        for (const auto& [key, value] : v.entries) {
          pickle_value(out, *key);
          pickle_value(out, *value);
        }
        out += 'u';
      }
      break;
    case PyValue::Kind::kGlobal: {
      const size_t dot = v.text.rfind('.');
      out += 'c';
      out += v.text.substr(0, dot) + "\n" + v.text.substr(dot + 1) + "\n";
      break;
    }
    case PyValue::Kind::kCall: {
      pickle_value(out, *v.callee);
      out += '(';
      for (const auto& item : v.items) pickle_value(out, *item);
      out += 't';
      out += static_cast<char>(v.new_object ? 0x81 : 'R');
      if (v.state != nullptr) {
        pickle_value(out, *v.state);
        out += 'b';
      }
      break;
    }
    case PyValue::Kind::kPersistentId:
      TITAN_CHECK_VALUE(false, "[titan::checkpoint::pickle] expected data, got a persistent id.");
  }
}

}  // namespace

std::string PyValue::class_name() const { return kind == Kind::kCall && callee ? callee->text : ""; }

PyRef PyValue::get(std::string_view key) const {
  for (const auto& [k, v] : entries) {
    if (k->kind == Kind::kStr && k->text == key) return v;
  }
  return nullptr;
}

std::string PyValue::describe() const {
  switch (kind) {
    case Kind::kNone:
      return "None";
    case Kind::kBool:
      return boolean ? "True" : "False";
    case Kind::kInt:
      return fmt::format("int {}", integer);
    case Kind::kFloat:
      return fmt::format("float {}", real);
    case Kind::kStr:
      return fmt::format("str '{}'", text.size() > 60 ? text.substr(0, 57) + "..." : text);
    case Kind::kBytes:
      return fmt::format("bytes of length {}", text.size());
    case Kind::kList:
      return fmt::format("a list of {}", items.size());
    case Kind::kTuple:
      return fmt::format("a tuple of {}", items.size());
    case Kind::kDict:
      return fmt::format("a dict of {}", entries.size());
    case Kind::kGlobal:
      return fmt::format("global {}", text);
    case Kind::kCall:
      return fmt::format("{}(...)", class_name());
    case Kind::kPersistentId:
      return "a persistent id";
  }
  return "?";
}

PyRef py_none() { return make_py(PyValue::Kind::kNone); }
PyRef py_bool(bool v) {
  PyRef r = make_py(PyValue::Kind::kBool);
  r->boolean = v;
  return r;
}
PyRef py_int(int64_t v) {
  PyRef r = make_py(PyValue::Kind::kInt);
  r->integer = v;
  return r;
}
PyRef py_float(double v) {
  PyRef r = make_py(PyValue::Kind::kFloat);
  r->real = v;
  return r;
}
PyRef py_str(std::string v) {
  PyRef r = make_py(PyValue::Kind::kStr);
  r->text = std::move(v);
  return r;
}
PyRef py_list(std::vector<PyRef> items) {
  PyRef r = make_py(PyValue::Kind::kList);
  r->items = std::move(items);
  return r;
}
PyRef py_tuple(std::vector<PyRef> items) {
  PyRef r = make_py(PyValue::Kind::kTuple);
  r->items = std::move(items);
  return r;
}
PyRef py_dict(std::vector<std::pair<PyRef, PyRef>> entries) {
  PyRef r = make_py(PyValue::Kind::kDict);
  r->entries = std::move(entries);
  return r;
}
PyRef py_global(const std::string& qualified) {
  PyRef r = make_py(PyValue::Kind::kGlobal);
  r->text = qualified;
  return r;
}
PyRef py_call(PyRef callee, std::vector<PyRef> args, PyRef state, bool new_object) {
  PyRef r = make_py(PyValue::Kind::kCall);
  r->callee = std::move(callee);
  r->items = std::move(args);
  r->state = std::move(state);
  r->new_object = new_object;
  return r;
}

PyRef unpickle(std::string_view bytes, const GlobalFilter& allowed, const std::string& what, bool persistent) {
  return Unpickler(bytes, allowed, what, persistent).run();
}

std::string pickle(const PyValue& value) {
  std::string out = "\x80\x02";  // PROTO 2
  pickle_value(out, value);
  out += '.';
  return out;
}

}  // namespace titan::checkpoint
