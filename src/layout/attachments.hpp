// SPDX-License-Identifier: BSD-3-Clause
// The one index from a subject (a parameter's TensorImpl, a module) to what a parallelize() handle
// attached to it: a parameter's binding, a module's tensor-parallel hook, its checkpoint mark.
// LibTorch's tensors and modules have no slot for such state, so it is found by address, under one
// lifetime rule for every kind of attachment:
//
//   - the handle that attaches a value owns it and detaches it when it goes; a detach removes only
//     the value that handle attached, never one another handle attached since;
//   - an entry holds its subject weakly and is seen only while that subject lives: a subject built
//     later at the same address never sees it (and the weak reference keeps the address from being
//     reused at all where the subject's allocation holds its control block: make_shared modules,
//     TensorImpls). Entries of dead subjects are swept on the next attach.
//
// Ranks as threads each attach to their own model, so the index is shared and locked; a lookup is a
// relaxed load when nothing is attached, else a shared lock and a hash probe.
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <unordered_map>

namespace titan::parallel::detail {

/// Subject: the key type (c10::TensorImpl, torch::nn::Module); Weak: a weak reference to it with
/// expired() (c10::weak_intrusive_ptr, std::weak_ptr); Value: what is attached.
template <class Subject, class Weak, class Value>
class Attachments {
 public:
  /// count: the entries, read without the lock by the layers' fast path (nothing attached anywhere).
  explicit Attachments(std::atomic<int64_t>& count) : count_(count) {}

  /// Attaches value to subject (replacing what was there); returns it for the owner's detach.
  Value* attach(const Subject* subject, Weak weak, std::shared_ptr<Value> value) {
    std::unique_lock lock(mutex_);
    std::erase_if(entries_, [this](const auto& item) {
      if (!item.second.subject.expired()) return false;
      count_.fetch_sub(1, std::memory_order_relaxed);
      return true;
    });
    Value* raw = value.get();
    auto [it, inserted] = entries_.insert_or_assign(subject, Entry{std::move(weak), std::move(value)});
    if (inserted) count_.fetch_add(1, std::memory_order_relaxed);
    return raw;
  }

  /// Removes subject's value if it is still `attached` (null: whatever is there).
  void detach(const Subject* subject, const Value* attached = nullptr) {
    std::unique_lock lock(mutex_);
    auto it = entries_.find(subject);
    if (it == entries_.end() || (attached != nullptr && it->second.value.get() != attached)) return;
    entries_.erase(it);
    count_.fetch_sub(1, std::memory_order_relaxed);
  }

  /// Replaces subject's value in place if it is still `attached` (a tombstone for a gone handle).
  void replace(const Subject* subject, const Value* attached, std::shared_ptr<Value> value) {
    std::unique_lock lock(mutex_);
    auto it = entries_.find(subject);
    if (it == entries_.end() || it->second.value.get() != attached) return;
    it->second.value = std::move(value);
  }

  /// subject's value, or null when nothing is attached to this subject (the one at this address now).
  Value* find(const Subject* subject) const {
    if (count_.load(std::memory_order_relaxed) == 0) return nullptr;
    std::shared_lock lock(mutex_);
    auto it = entries_.find(subject);
    if (it == entries_.end() || it->second.subject.expired()) return nullptr;
    return it->second.value.get();
  }

 private:
  struct Entry {
    Weak subject;                  // pins the address where the allocation allows, never the subject
    std::shared_ptr<Value> value;  // shared with the handle that attached it
  };
  std::atomic<int64_t>& count_;
  mutable std::shared_mutex mutex_;
  std::unordered_map<const Subject*, Entry> entries_;
};

}  // namespace titan::parallel::detail
