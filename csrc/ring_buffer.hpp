// Single-producer single-consumer ring buffer of float32 samples.
//
// One thread writes (the PortAudio callback or the worker), one thread reads.
// Indices are monotonically increasing 64-bit counters, so "full" and "empty"
// never alias; positions are taken modulo the capacity. No locks, no
// allocation after construction: safe to call from an audio callback.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <vector>

namespace rtanon {

class RingBuffer {
 public:
  explicit RingBuffer(std::size_t capacity) : buf_(capacity) {
    if (capacity == 0) throw std::invalid_argument("RingBuffer capacity must be > 0 samples");
  }

  std::size_t capacity() const { return buf_.size(); }

  std::size_t readable() const {
    return static_cast<std::size_t>(head_.load(std::memory_order_acquire) -
                                    tail_.load(std::memory_order_acquire));
  }

  std::size_t writable() const { return capacity() - readable(); }

  // Copies up to n samples in; returns how many fitted. Producer side only.
  std::size_t write(const float* src, std::size_t n) {
    const std::uint64_t head = head_.load(std::memory_order_relaxed);
    const std::uint64_t tail = tail_.load(std::memory_order_acquire);
    const std::size_t free_n = capacity() - static_cast<std::size_t>(head - tail);
    n = std::min(n, free_n);
    const std::size_t pos = static_cast<std::size_t>(head % capacity());
    const std::size_t first = std::min(n, capacity() - pos);
    std::memcpy(buf_.data() + pos, src, first * sizeof(float));
    std::memcpy(buf_.data(), src + first, (n - first) * sizeof(float));
    head_.store(head + n, std::memory_order_release);
    return n;
  }

  // Copies up to n samples out; returns how many were there. Consumer side only.
  std::size_t read(float* dst, std::size_t n) {
    const std::uint64_t tail = tail_.load(std::memory_order_relaxed);
    const std::uint64_t head = head_.load(std::memory_order_acquire);
    n = std::min(n, static_cast<std::size_t>(head - tail));
    const std::size_t pos = static_cast<std::size_t>(tail % capacity());
    const std::size_t first = std::min(n, capacity() - pos);
    std::memcpy(dst, buf_.data() + pos, first * sizeof(float));
    std::memcpy(dst + first, buf_.data(), (n - first) * sizeof(float));
    tail_.store(tail + n, std::memory_order_release);
    return n;
  }

  // Drops up to n samples without copying them; consumer side only.
  std::size_t discard(std::size_t n) {
    const std::uint64_t tail = tail_.load(std::memory_order_relaxed);
    const std::uint64_t head = head_.load(std::memory_order_acquire);
    n = std::min(n, static_cast<std::size_t>(head - tail));
    tail_.store(tail + n, std::memory_order_release);
    return n;
  }

  // Empties the buffer. Only when neither side is running.
  void clear() {
    head_.store(0, std::memory_order_release);
    tail_.store(0, std::memory_order_release);
  }

 private:
  std::vector<float> buf_;
  std::atomic<std::uint64_t> head_{0};  // total samples written
  std::atomic<std::uint64_t> tail_{0};  // total samples read
};

}  // namespace rtanon
