// Ranks for messages: "1, 3-5, 9", runs of consecutive ranks as ranges, and past `shown`
// runs how many ranks more.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include <fmt/format.h>

namespace braid::transport::detail {

inline std::string list_ranks(const std::vector<int>& ranks, std::size_t shown = 16) {
  std::string text;
  std::size_t runs = 0;
  std::size_t i = 0;
  while (i < ranks.size() && runs < shown) {
    std::size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    if (runs++ > 0) text += ", ";
    text += j == i ? std::to_string(ranks[i]) : fmt::format("{}-{}", ranks[i], ranks[j]);
    i = j + 1;
  }
  if (i < ranks.size()) text += fmt::format(" and {} more", ranks.size() - i);
  return text;
}

}  // namespace braid::transport::detail
