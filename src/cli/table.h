// How `torus status` and `torus list` print: amounts, table cells, aligned tables. Header-only
// (the torus binary's sources are listed in CMakeLists.txt).
// Threading: pure functions, except that the Print* functions write to std::cout.
#pragma once

#include <algorithm>
#include <iomanip>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "common/resources.h"

namespace torus {

// An amount as a person writes it: 4, 0.5, 1e+09 only when it is that large.
inline std::string FormatAmount(double v) {
  std::ostringstream os;
  os << std::setprecision(10) << v;
  return os.str();
}

// A table cell: strings as they are, objects as "k: v, ...", lists of objects as their count,
// byte amounts human-readably.
inline std::string Cell(const std::string& key, const nlohmann::ordered_json& v) {
  if (v.is_string()) return v.get<std::string>();
  if (v.is_number() && (key == "size_bytes" || key == "memory")) return HumanBytes(v.get<double>());
  if (v.is_object()) {
    std::string out;
    for (const auto& [k, x] : v.items()) out += (out.empty() ? "" : ", ") + k + ": " + Cell(k, x);
    return out;
  }
  if (v.is_array() && !v.empty() && v[0].is_object()) return std::to_string(v.size());
  return v.dump();
}

inline void PrintTable(const std::vector<std::string>& header, const std::vector<std::vector<std::string>>& rows) {
  std::vector<size_t> w(header.size());
  for (size_t i = 0; i < header.size(); ++i) w[i] = header[i].size();
  for (const auto& r : rows)
    for (size_t i = 0; i < r.size(); ++i) w[i] = std::max(w[i], r[i].size());
  auto line = [&](const std::vector<std::string>& r) {
    for (size_t i = 0; i < r.size(); ++i) std::cout << std::setw(w[i] + 2) << std::left << r[i];
    std::cout << "\n";
  };
  line(header);
  for (const auto& r : rows) line(r);
}

// `out` as a table whose columns are the keys of its first row.
inline void PrintRows(const nlohmann::ordered_json& out) {
  std::vector<std::string> header;
  for (auto& [k, v] : out[0].items()) header.push_back(k);
  std::vector<std::vector<std::string>> rows;
  for (const auto& j : out) {
    std::vector<std::string> r;
    for (const auto& h : header) r.push_back(Cell(h, j[h]));
    rows.push_back(r);
  }
  PrintTable(header, rows);
}

}  // namespace torus
