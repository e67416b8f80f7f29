// split_list: a flag's comma-separated values ("a,b,,c" -> a, b, c), for the benchmark programs.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace streamalloc::bench {

inline std::vector<std::string> split_list(const std::string& text) {
  std::vector<std::string> out;
  std::size_t start = 0;
  while (start <= text.size()) {
    std::size_t end = text.find(',', start);
    if (end == std::string::npos) end = text.size();
    if (end > start) out.push_back(text.substr(start, end - start));
    start = end + 1;
  }
  return out;
}

}  // namespace streamalloc::bench
