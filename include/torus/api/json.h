// A small JSON value, parser and writer, used only by RuntimeEnv (Ray's public RuntimeEnv API
// speaks JSON; Torus ships no JSON library). Not a general-purpose JSON library: numbers are
// int64 or double, objects keep keys sorted (as nlohmann::json does, so dumps match Ray's).
//
// Parse() accepts untrusted text: it never crashes on malformed input, bounds nesting depth,
// and reports errors as std::invalid_argument with the byte offset.
#pragma once

#include <charconv>
#include <cmath>
#include <cstdint>
#include <map>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

// Ray's RuntimeEnv stores nlohmann::json values, so Ray programs hand it types with nlohmann
// converters (to_json/from_json found by ADL, or an adl_serializer specialization). When
// nlohmann/json is installed it is included (Ray's <ray/api.h> includes it too) and such types
// are accepted; see ToJson/FromJson.
#if __has_include(<nlohmann/json.hpp>)
#include <nlohmann/json.hpp>
#define TORUS_HAS_NLOHMANN_JSON 1
#endif

namespace torus::internal {

class Json {
 public:
  enum class Type { kNull, kBool, kInt, kDouble, kString, kArray, kObject };
  using Array = std::vector<Json>;
  // Sorted keys. std::map of an incomplete value type is supported by libstdc++ and libc++.
  using Object = std::map<std::string, Json>;

  Json() = default;
  explicit Json(bool v) : type_(Type::kBool), bool_(v) {}
  explicit Json(int64_t v) : type_(Type::kInt), int_(v) {}
  explicit Json(double v) : type_(Type::kDouble), double_(v) {}
  explicit Json(std::string v) : type_(Type::kString), string_(std::move(v)) {}
  explicit Json(Array v) : type_(Type::kArray), array_(std::move(v)) {}
  explicit Json(Object v) : type_(Type::kObject), object_(std::move(v)) {}

  Type type() const { return type_; }
  bool is_number() const { return type_ == Type::kInt || type_ == Type::kDouble; }
  // Accessors; the caller checks type() first.
  bool as_bool() const { return bool_; }
  int64_t as_int() const { return int_; }
  double as_double() const { return type_ == Type::kInt ? static_cast<double>(int_) : double_; }
  const std::string& as_string() const { return string_; }
  const Array& as_array() const { return array_; }
  const Object& as_object() const { return object_; }
  Object& mutable_object() { return object_; }

  // Compact text, no whitespace.
  std::string Dump() const {
    std::string out;
    DumpTo(&out);
    return out;
  }

  // Parses one complete JSON document (surrounding whitespace allowed).
  static Json Parse(std::string_view text) {
    Parser parser{text};
    parser.SkipSpace();
    Json value = parser.ParseValue(0);
    parser.SkipSpace();
    if (parser.pos != text.size()) parser.Fail("unexpected trailing characters");
    return value;
  }

 private:
  // The nesting limit of every JSON document Torus reads (src/common/json_limits.h).
  static constexpr int kMaxDepth = 64;

  struct Parser {
    std::string_view text;
    size_t pos = 0;

    [[noreturn]] void Fail(const std::string& what) const {
      throw std::invalid_argument("invalid JSON at offset " + std::to_string(pos) + ": " + what);
    }
    void SkipSpace() {
      while (pos < text.size() &&
             (text[pos] == ' ' || text[pos] == '\t' || text[pos] == '\n' || text[pos] == '\r')) {
        ++pos;
      }
    }
    bool Consume(std::string_view word) {
      if (text.substr(pos, word.size()) != word) return false;
      pos += word.size();
      return true;
    }
    // `depth`: how many arrays and objects enclose the value.
    Json ParseValue(int depth) {
      if (pos >= text.size()) Fail("unexpected end of text");
      const char c = text[pos];
      if ((c == '{' || c == '[') && depth >= kMaxDepth) {
        Fail("JSON nested deeper than " + std::to_string(kMaxDepth) + " levels");
      }
      if (c == '{') return ParseObject(depth);
      if (c == '[') return ParseArray(depth);
      if (c == '"') return Json(ParseString());
      if (Consume("true")) return Json(true);
      if (Consume("false")) return Json(false);
      if (Consume("null")) return Json();
      if (c == '-' || (c >= '0' && c <= '9')) return ParseNumber();
      Fail(std::string("unexpected character '") + c + "'");
    }
    Json ParseObject(int depth) {
      ++pos;  // '{'
      Object object;
      SkipSpace();
      if (pos < text.size() && text[pos] == '}') {
        ++pos;
        return Json(std::move(object));
      }
      while (true) {
        SkipSpace();
        if (pos >= text.size() || text[pos] != '"') Fail("expected a string key");
        std::string key = ParseString();
        SkipSpace();
        if (pos >= text.size() || text[pos] != ':') Fail("expected ':'");
        ++pos;
        SkipSpace();
        object[std::move(key)] = ParseValue(depth + 1);
        SkipSpace();
        if (pos < text.size() && text[pos] == ',') {
          ++pos;
          continue;
        }
        if (pos < text.size() && text[pos] == '}') {
          ++pos;
          return Json(std::move(object));
        }
        Fail("expected ',' or '}'");
      }
    }
    Json ParseArray(int depth) {
      ++pos;  // '['
      Array array;
      SkipSpace();
      if (pos < text.size() && text[pos] == ']') {
        ++pos;
        return Json(std::move(array));
      }
      while (true) {
        SkipSpace();
        array.push_back(ParseValue(depth + 1));
        SkipSpace();
        if (pos < text.size() && text[pos] == ',') {
          ++pos;
          continue;
        }
        if (pos < text.size() && text[pos] == ']') {
          ++pos;
          return Json(std::move(array));
        }
        Fail("expected ',' or ']'");
      }
    }
    unsigned ParseHex4() {
      if (text.size() - pos < 4) Fail("truncated \\u escape");
      unsigned value = 0;
      for (int i = 0; i < 4; ++i) {
        const char h = text[pos++];
        value <<= 4;
        if (h >= '0' && h <= '9') {
          value |= static_cast<unsigned>(h - '0');
        } else if (h >= 'a' && h <= 'f') {
          value |= static_cast<unsigned>(h - 'a' + 10);
        } else if (h >= 'A' && h <= 'F') {
          value |= static_cast<unsigned>(h - 'A' + 10);
        } else {
          Fail("bad hex digit in \\u escape");
        }
      }
      return value;
    }
    static void AppendUtf8(unsigned cp, std::string* out) {
      if (cp < 0x80) {
        *out += static_cast<char>(cp);
      } else if (cp < 0x800) {
        *out += static_cast<char>(0xC0 | (cp >> 6));
        *out += static_cast<char>(0x80 | (cp & 0x3F));
      } else if (cp < 0x10000) {
        *out += static_cast<char>(0xE0 | (cp >> 12));
        *out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
        *out += static_cast<char>(0x80 | (cp & 0x3F));
      } else {
        *out += static_cast<char>(0xF0 | (cp >> 18));
        *out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
        *out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
        *out += static_cast<char>(0x80 | (cp & 0x3F));
      }
    }
    std::string ParseString() {
      ++pos;  // opening quote
      std::string out;
      while (true) {
        if (pos >= text.size()) Fail("unterminated string");
        const char c = text[pos++];
        if (c == '"') return out;
        if (static_cast<unsigned char>(c) < 0x20) Fail("control character in string");
        if (c != '\\') {
          out += c;
          continue;
        }
        if (pos >= text.size()) Fail("unterminated escape");
        const char e = text[pos++];
        switch (e) {
          case '"': out += '"'; break;
          case '\\': out += '\\'; break;
          case '/': out += '/'; break;
          case 'b': out += '\b'; break;
          case 'f': out += '\f'; break;
          case 'n': out += '\n'; break;
          case 'r': out += '\r'; break;
          case 't': out += '\t'; break;
          case 'u': {
            unsigned cp = ParseHex4();
            if (cp >= 0xD800 && cp <= 0xDBFF) {
              if (!Consume("\\u")) Fail("unpaired surrogate");
              const unsigned low = ParseHex4();
              if (low < 0xDC00 || low > 0xDFFF) Fail("unpaired surrogate");
              cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
            } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
              Fail("unpaired surrogate");
            }
            AppendUtf8(cp, &out);
            break;
          }
          default: Fail("unknown escape");
        }
      }
    }
    Json ParseNumber() {
      const size_t start = pos;
      if (text[pos] == '-') ++pos;
      auto digits = [&] {
        const size_t first = pos;
        while (pos < text.size() && text[pos] >= '0' && text[pos] <= '9') ++pos;
        if (pos == first) Fail("expected a digit");
      };
      if (pos < text.size() && text[pos] == '0') {
        ++pos;
      } else {
        digits();
      }
      bool is_double = false;
      if (pos < text.size() && text[pos] == '.') {
        is_double = true;
        ++pos;
        digits();
      }
      if (pos < text.size() && (text[pos] == 'e' || text[pos] == 'E')) {
        is_double = true;
        ++pos;
        if (pos < text.size() && (text[pos] == '+' || text[pos] == '-')) ++pos;
        digits();
      }
      const char* first = text.data() + start;
      const char* last = text.data() + pos;
      if (!is_double) {
        int64_t value = 0;
        auto [ptr, ec] = std::from_chars(first, last, value);
        if (ec == std::errc() && ptr == last) return Json(value);
        // Out of int64 range: fall through and keep it as a double.
      }
      double value = 0;
      auto [ptr, ec] = std::from_chars(first, last, value);
      if (ec != std::errc() || ptr != last) Fail("number out of range");
      return Json(value);
    }
  };

  static void DumpString(const std::string& s, std::string* out) {
    static constexpr char kHex[] = "0123456789abcdef";
    *out += '"';
    for (const char c : s) {
      switch (c) {
        case '"': *out += "\\\""; break;
        case '\\': *out += "\\\\"; break;
        case '\b': *out += "\\b"; break;
        case '\f': *out += "\\f"; break;
        case '\n': *out += "\\n"; break;
        case '\r': *out += "\\r"; break;
        case '\t': *out += "\\t"; break;
        default:
          if (static_cast<unsigned char>(c) < 0x20) {
            *out += "\\u00";
            *out += kHex[(c >> 4) & 0xF];
            *out += kHex[c & 0xF];
          } else {
            *out += c;
          }
      }
    }
    *out += '"';
  }

  void DumpTo(std::string* out) const {
    switch (type_) {
      case Type::kNull: *out += "null"; break;
      case Type::kBool: *out += bool_ ? "true" : "false"; break;
      case Type::kInt: *out += std::to_string(int_); break;
      case Type::kDouble: {
        if (!std::isfinite(double_)) {
          *out += "null";  // JSON has no NaN or infinity
          break;
        }
        char buf[64];
        auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), double_);
        (void)ec;  // 64 bytes always fit the shortest form of a double
        std::string text(buf, end);
        if (text.find_first_of(".e") == std::string::npos) text += ".0";
        *out += text;
        break;
      }
      case Type::kString: DumpString(string_, out); break;
      case Type::kArray: {
        *out += '[';
        for (size_t i = 0; i < array_.size(); ++i) {
          if (i > 0) *out += ',';
          array_[i].DumpTo(out);
        }
        *out += ']';
        break;
      }
      case Type::kObject: {
        *out += '{';
        bool first = true;
        for (const auto& [key, value] : object_) {
          if (!first) *out += ',';
          first = false;
          DumpString(key, out);
          *out += ':';
          value.DumpTo(out);
        }
        *out += '}';
        break;
      }
    }
  }

  Type type_ = Type::kNull;
  bool bool_ = false;
  int64_t int_ = 0;
  double double_ = 0;
  std::string string_;
  Array array_;
  Object object_;
};

// ---- conversion between C++ values and Json, for RuntimeEnv::Set / Get ----
// Supported: bool, arithmetic types, strings, sequences (vector, list, set, ...) and maps with
// string keys, nested freely, Json itself, and (with nlohmann/json installed) nlohmann::json
// and any type nlohmann::json converts (to_json / from_json), through JSON text.

template <typename T, typename = void>
struct IsJsonMap : std::false_type {};
template <typename T>
struct IsJsonMap<T, std::void_t<typename T::key_type, typename T::mapped_type>>
    : std::is_convertible<typename T::key_type, std::string> {};

template <typename T, typename = void>
struct IsJsonSequence : std::false_type {};
template <typename T>
struct IsJsonSequence<T, std::void_t<typename T::value_type, decltype(std::declval<T&>().begin()),
                                     decltype(std::declval<T&>().end())>> : std::true_type {};

template <typename T>
inline constexpr bool kAlwaysFalse = false;

#ifdef TORUS_HAS_NLOHMANN_JSON
// Whether nlohmann::json converts T (a user type with to_json / from_json).
template <typename T>
inline constexpr bool kNlohmannToJson = std::is_constructible_v<nlohmann::json, const T&>;
template <typename T>
inline constexpr bool kNlohmannFromJson = requires(const nlohmann::json& j) {
  j.template get<T>();
};
template <typename T>
inline constexpr bool kIsNlohmannJson = std::is_same_v<T, nlohmann::json>;
#else
template <typename T>
inline constexpr bool kNlohmannToJson = false;
template <typename T>
inline constexpr bool kNlohmannFromJson = false;
template <typename T>
inline constexpr bool kIsNlohmannJson = false;
#endif

template <typename T>
Json ToJson(const T& value) {
  if constexpr (std::is_same_v<T, Json>) {
    return value;
  } else if constexpr (kIsNlohmannJson<T>) {
    return Json::Parse(value.dump());
  } else if constexpr (std::is_same_v<T, bool>) {
    return Json(value);
  } else if constexpr (std::is_integral_v<T>) {
    return Json(static_cast<int64_t>(value));
  } else if constexpr (std::is_floating_point_v<T>) {
    return Json(static_cast<double>(value));
  } else if constexpr (std::is_convertible_v<const T&, std::string_view>) {
    return Json(std::string(std::string_view(value)));
  } else if constexpr (IsJsonMap<T>::value) {
    Json::Object object;
    for (const auto& [key, item] : value) object[std::string(key)] = ToJson(item);
    return Json(std::move(object));
  } else if constexpr (IsJsonSequence<T>::value) {
    Json::Array array;
    for (const auto& item : value) array.push_back(ToJson(item));
    return Json(std::move(array));
  } else if constexpr (kNlohmannToJson<T>) {
    return Json::Parse(nlohmann::json(value).dump());
  } else {
    static_assert(kAlwaysFalse<T>,
                  "RuntimeEnv::Set supports bool, numbers, strings, vectors/maps of them and types "
                  "with nlohmann::json to_json (include <nlohmann/json.hpp>); for other types "
                  "build the JSON text yourself and use SetJsonStr");
  }
}

// Throws std::invalid_argument when `json` does not hold a T.
template <typename T>
T FromJson(const Json& json) {
  auto mismatch = [](const char* want) {
    return std::invalid_argument(std::string("expected a JSON ") + want);
  };
  if constexpr (std::is_same_v<T, Json>) {
    return json;
  } else if constexpr (kIsNlohmannJson<T>) {
    return nlohmann::json::parse(json.Dump());
  } else if constexpr (std::is_same_v<T, bool>) {
    if (json.type() != Json::Type::kBool) throw mismatch("boolean");
    return json.as_bool();
  } else if constexpr (std::is_integral_v<T>) {
    if (json.type() != Json::Type::kInt) throw mismatch("integer");
    return static_cast<T>(json.as_int());
  } else if constexpr (std::is_floating_point_v<T>) {
    if (!json.is_number()) throw mismatch("number");
    return static_cast<T>(json.as_double());
  } else if constexpr (std::is_same_v<T, std::string>) {
    if (json.type() != Json::Type::kString) throw mismatch("string");
    return json.as_string();
  } else if constexpr (IsJsonMap<T>::value) {
    if (json.type() != Json::Type::kObject) throw mismatch("object");
    T out;
    for (const auto& [key, item] : json.as_object()) {
      out.emplace(key, FromJson<typename T::mapped_type>(item));
    }
    return out;
  } else if constexpr (IsJsonSequence<T>::value) {
    if (json.type() != Json::Type::kArray) throw mismatch("array");
    T out;
    for (const auto& item : json.as_array()) {
      out.insert(out.end(), FromJson<typename T::value_type>(item));
    }
    return out;
  } else if constexpr (kNlohmannFromJson<T>) {
    try {
      return nlohmann::json::parse(json.Dump()).template get<T>();
    } catch (const nlohmann::json::exception& e) {
      throw std::invalid_argument(e.what());
    }
  } else {
    static_assert(kAlwaysFalse<T>,
                  "RuntimeEnv::Get supports bool, numbers, std::string, containers of them and "
                  "types with nlohmann::json from_json; for other types use GetJsonStr");
  }
}

}  // namespace torus::internal
