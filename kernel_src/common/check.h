// FUSED_MLP_CHECK(cond, parts...): TORCH_CHECK with a message assembled here.
//
// Integers and shapes become text through std::to_string, never through std::ostream:
// on the GPU machine's toolchain (gcc 13.3, glibc 2.39, torch 2.11) a TORCH_CHECK that
// streamed an int64 from this extension crashed inside std::ostream::_M_insert<long>
// (segfault; benchmarks/results/gpu_tests_h200.md, session 1), while messages made only
// of strings worked. The
// root cause is not known; assembling the message as a string sidesteps it everywhere.
#pragma once

#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>
#include <c10/util/ArrayRef.h>
#include <c10/util/Exception.h>

#include <string>
#include <type_traits>

namespace fused_mlp::detail {

inline void append(std::string& s, const char* v) { s += v; }
inline void append(std::string& s, const std::string& v) { s += v; }
template <typename T, std::enable_if_t<std::is_integral_v<T>, int> = 0>
inline void append(std::string& s, T v) {
  s += std::to_string(v);
}
inline void append(std::string& s, c10::IntArrayRef v) {
  s += '[';
  for (size_t i = 0; i < v.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(v[i]);
  }
  s += ']';
}
inline void append(std::string& s, c10::ScalarType v) { s += c10::toString(v); }
inline void append(std::string& s, const c10::Device& v) { s += v.str(); }

template <typename... Parts>
std::string message(const Parts&... parts) {
  std::string s;
  (append(s, parts), ...);
  return s;
}

}  // namespace fused_mlp::detail

#define FUSED_MLP_CHECK(cond, ...) TORCH_CHECK((cond), ::fused_mlp::detail::message(__VA_ARGS__))
