#include "head/serve_metrics.h"

#include <set>

namespace torus {

namespace {

// Strict UTF-8: shortest forms only, no surrogates, nothing past U+10FFFF.
bool ValidUtf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c < 0x80) {
      ++i;
      continue;
    }
    size_t n;
    unsigned char lo = 0x80, hi = 0xBF;  // the bounds of the second byte
    if (c >= 0xC2 && c <= 0xDF) {
      n = 2;
    } else if (c >= 0xE0 && c <= 0xEF) {
      n = 3;
      if (c == 0xE0) lo = 0xA0;  // overlong below
      if (c == 0xED) hi = 0x9F;  // surrogates above
    } else if (c >= 0xF0 && c <= 0xF4) {
      n = 4;
      if (c == 0xF0) lo = 0x90;  // overlong below
      if (c == 0xF4) hi = 0x8F;  // past U+10FFFF above
    } else {
      return false;
    }
    if (i + n > s.size()) return false;
    const auto second = static_cast<unsigned char>(s[i + 1]);
    if (second < lo || second > hi) return false;
    for (size_t k = 2; k < n; ++k) {
      if ((static_cast<unsigned char>(s[i + k]) & 0xC0) != 0x80) return false;
    }
    i += n;
  }
  return true;
}

bool IsBlank(char c) { return c == ' ' || c == '\t'; }
bool IsDigit(char c) { return c >= '0' && c <= '9'; }
bool IsLetter(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }

// A cursor over one line.
class Line {
 public:
  explicit Line(std::string_view s) : s_(s) {}

  bool AtEnd() const { return i_ == s_.size(); }
  char Peek() const { return AtEnd() ? '\0' : s_[i_]; }
  bool Take(char c) {
    if (Peek() != c || AtEnd()) return false;
    ++i_;
    return true;
  }
  // Skips blanks; whether there was at least one.
  bool Blanks() {
    size_t from = i_;
    while (!AtEnd() && IsBlank(s_[i_])) ++i_;
    return i_ > from;
  }
  // [a-zA-Z_:][a-zA-Z0-9_:]* ("" when there is none here).
  std::string_view MetricName() { return Name(true); }
  // [a-zA-Z_][a-zA-Z0-9_]*
  std::string_view LabelName() { return Name(false); }
  // The characters up to the next blank or the end.
  std::string_view Word() {
    size_t from = i_;
    while (!AtEnd() && !IsBlank(s_[i_])) ++i_;
    return s_.substr(from, i_ - from);
  }
  // The rest of the line, with only the escapes `allowed` lists after a backslash.
  bool RestEscaped(std::string_view allowed) {
    while (!AtEnd()) {
      if (s_[i_] == '\\') {
        if (i_ + 1 == s_.size() || allowed.find(s_[i_ + 1]) == std::string_view::npos) return false;
        ++i_;
      }
      ++i_;
    }
    return true;
  }
  // A quoted label value: `"` ... `"` with \\ \" \n escapes only.
  bool QuotedValue() {
    if (!Take('"')) return false;
    while (!AtEnd()) {
      char c = s_[i_++];
      if (c == '"') return true;
      if (c == '\\') {
        if (AtEnd()) return false;
        char e = s_[i_++];
        if (e != '\\' && e != '"' && e != 'n') return false;
      }
    }
    return false;
  }

 private:
  std::string_view Name(bool colons) {
    size_t from = i_;
    auto first = [&](char c) { return IsLetter(c) || c == '_' || (colons && c == ':'); };
    if (AtEnd() || !first(s_[i_])) return {};
    ++i_;
    while (!AtEnd() && (first(s_[i_]) || IsDigit(s_[i_]))) ++i_;
    return s_.substr(from, i_ - from);
  }

  std::string_view s_;
  size_t i_ = 0;
};

bool EqualsIgnoringCase(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    auto lower = [](char c) { return c >= 'A' && c <= 'Z' ? static_cast<char>(c - 'A' + 'a') : c; };
    if (lower(a[i]) != lower(b[i])) return false;
  }
  return true;
}

// A sample value as Prometheus's parser (Go's strconv.ParseFloat) takes it, hexadecimal and
// digit separators left out: a decimal number, NaN, or a signed or unsigned Inf / Infinity.
bool SampleValue(std::string_view v) {
  std::string_view body = v;
  if (!body.empty() && (body[0] == '+' || body[0] == '-')) body.remove_prefix(1);
  if (EqualsIgnoringCase(body, "inf") || EqualsIgnoringCase(body, "infinity")) return true;
  if (EqualsIgnoringCase(v, "nan")) return true;
  size_t i = 0, digits = 0;
  while (i < body.size() && IsDigit(body[i])) ++i, ++digits;
  if (i < body.size() && body[i] == '.') {
    ++i;
    while (i < body.size() && IsDigit(body[i])) ++i, ++digits;
  }
  if (digits == 0) return false;
  if (i < body.size() && (body[i] == 'e' || body[i] == 'E')) {
    ++i;
    if (i < body.size() && (body[i] == '+' || body[i] == '-')) ++i;
    size_t exp = 0;
    while (i < body.size() && IsDigit(body[i])) ++i, ++exp;
    if (exp == 0) return false;
  }
  return i == body.size();
}

bool Timestamp(std::string_view t) {
  if (!t.empty() && t[0] == '-') t.remove_prefix(1);
  if (t.empty()) return false;
  for (char c : t) {
    if (!IsDigit(c)) return false;
  }
  return true;
}

bool Serves(std::string_view name) { return name.substr(0, kServeMetricPrefix.size()) == kServeMetricPrefix; }

// `# HELP name ...` / `# TYPE name type` of a Serve metric, seen for the first time.
bool KeepComment(std::string_view text, std::set<std::string>& helped, std::set<std::string>& typed) {
  Line l(text);
  if (!l.Take('#') || !l.Blanks()) return false;
  std::string_view kind = l.Word();
  if (kind != "HELP" && kind != "TYPE") return false;
  if (!l.Blanks()) return false;
  std::string_view name = l.MetricName();
  if (!Serves(name)) return false;
  if (!l.Blanks()) return false;
  if (kind == "HELP") return l.RestEscaped("\\n") && helped.emplace(name).second;
  std::string_view type = l.Word();
  if (!l.AtEnd()) return false;
  if (type != "counter" && type != "gauge" && type != "histogram" && type != "summary" && type != "untyped") {
    return false;
  }
  return typed.emplace(name).second;
}

// `name{label="value",...} value [timestamp]` of a Serve metric, in the canonical spacing:
// nothing between the name and the labels or inside them, blanks between the fields, none at
// the end (what Prometheus's own clients write; its parsers differ on the rest).
bool KeepSample(std::string_view text) {
  Line l(text);
  if (!Serves(l.MetricName())) return false;
  if (l.Take('{')) {
    std::set<std::string_view> names;
    while (!l.Take('}')) {
      // Names starting with "__" are Prometheus's own (a `__name__` label would rename the
      // series); a repeated name fails Prometheus's whole scrape.
      std::string_view label = l.LabelName();
      if (label.empty() || label.substr(0, 2) == "__" || !names.insert(label).second) return false;
      if (!l.Take('=') || !l.QuotedValue()) return false;
      if (!l.Take(',') && l.Peek() != '}') return false;  // a trailing comma is allowed
    }
  }
  if (!l.Blanks() || !SampleValue(l.Word())) return false;
  if (l.AtEnd()) return true;
  return l.Blanks() && Timestamp(l.Word()) && l.AtEnd();
}

}  // namespace

ServeMetricsText FilterServeMetrics(std::string_view stored) {
  ServeMetricsText out;
  if (stored.size() > kServeMetricsMaxBytes) {
    out.refused = std::to_string(stored.size()) + " bytes, over the limit of " +
                  std::to_string(kServeMetricsMaxBytes);
    return out;
  }
  if (!ValidUtf8(stored)) {
    out.refused = "not valid UTF-8";
    return out;
  }
  out.text.reserve(stored.size() + 1);
  std::set<std::string> helped, typed;
  size_t pos = 0;
  while (pos < stored.size()) {
    size_t end = stored.find('\n', pos);
    if (end == std::string_view::npos) end = stored.size();
    std::string_view line = stored.substr(pos, end - pos);
    pos = end + 1;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty()) continue;
    bool keep = line[0] == '#' ? KeepComment(line, helped, typed) : KeepSample(line);
    if (!keep) {
      ++out.dropped_lines;
      continue;
    }
    out.text.append(line);
    out.text.push_back('\n');
  }
  return out;
}

}  // namespace torus
