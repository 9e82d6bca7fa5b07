// Which slice of the zero-counter pool (zero_counters.h) an eager launch uses: each stream owns one slice for
// good, assigned at its first launch. Launches on one stream run one after the other, and each leaves its counters
// at zero, so the next launch on that stream finds its slice zeroed; launches on different streams never share a
// slice, however many calls each queues. Host-only C++ (tested on the CPU).
//
// The per-thread default stream is one handle for every host thread but a different stream in each, so its key
// includes the calling thread. A destroyed stream keeps its slice; a new stream that gets the same handle takes it
// over, which is safe once the old stream's work has finished. When every slice has an owner the caller zeroes
// counters of its own instead.
#pragma once

#include <cstdint>
#include <mutex>
#include <vector>

namespace flash4::sm90 {

class StreamSlices {
 public:
  explicit StreamSlices(int slices) : slices_(slices) {}

  // The slice of (stream, thread_key) in [0, slices), or -1 when all are taken. thread_key separates the streams
  // that share a handle (the per-thread default stream); 0 for every other stream.
  int slice_of(uintptr_t stream, uint64_t thread_key) {
    std::lock_guard<std::mutex> lock(mutex_);
    for (size_t i = 0; i < owners_.size(); ++i) {
      if (owners_[i].stream == stream && owners_[i].thread_key == thread_key) return static_cast<int>(i);
    }
    if (static_cast<int>(owners_.size()) >= slices_) return -1;
    owners_.push_back({stream, thread_key});
    return static_cast<int>(owners_.size()) - 1;
  }

 private:
  struct Owner {
    uintptr_t stream;
    uint64_t thread_key;
  };
  const int slices_;
  std::mutex mutex_;
  std::vector<Owner> owners_;  // slice i belongs to owners_[i]
};

}  // namespace flash4::sm90
