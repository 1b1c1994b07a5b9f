#include "common/wire_states.h"

#include <cctype>
#include <map>
#include <utility>

namespace torus {
namespace {

// The text of every value of E, by number (so in the order the schema lists them); built once
// from the generated descriptor, so a value added to the schema has a text at once.
template <typename E, bool kLower>
const std::map<int, std::string>& Texts() {
  static const auto* texts = [] {
    auto* m = new std::map<int, std::string>;
    const auto* d = google::protobuf::GetEnumDescriptor<E>();
    for (int i = 0; i < d->value_count(); ++i) {
      std::string name = d->value(i)->name();
      if (kLower) {
        for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      }
      m->emplace(d->value(i)->number(), std::move(name));
    }
    return m;
  }();
  return *texts;
}

template <typename E, bool kLower>
const std::string& Name(E s) {
  static const std::string kNone;
  const auto& texts = Texts<E, kLower>();
  auto it = texts.find(static_cast<int>(s));
  return it == texts.end() ? kNone : it->second;
}

template <typename E, bool kLower>
Status Parse(std::string_view text, const char* what, E* out) {
  std::string all;
  for (const auto& [number, name] : Texts<E, kLower>()) {
    if (name == text) {
      *out = static_cast<E>(number);
      return Status::Ok();
    }
    all += (all.empty() ? "" : ", ") + name;
  }
  return InvalidArgument("unknown " + std::string(what) + " state \"" + std::string(text) + "\" (one of " +
                         all + ")");
}

}  // namespace

const std::string& StateName(rpc::TaskInfo::State s) { return Name<rpc::TaskInfo::State, false>(s); }
const std::string& StateName(rpc::PlacementGroupRecord::State s) {
  return Name<rpc::PlacementGroupRecord::State, false>(s);
}
const std::string& StateName(rpc::SliceSummary::State s) { return Name<rpc::SliceSummary::State, true>(s); }
const std::string& StateName(rpc::WorkerInfo::State s) { return Name<rpc::WorkerInfo::State, true>(s); }
const std::string& StateName(rpc::ActorRecord::State s) { return Name<rpc::ActorRecord::State, false>(s); }
const std::string& StateName(rpc::JobProcessInfo::State s) { return Name<rpc::JobProcessInfo::State, false>(s); }
const std::string& StateName(rpc::JobRecord::State s) { return Name<rpc::JobRecord::State, false>(s); }

Status ParseState(std::string_view text, rpc::TaskInfo::State* out) {
  return Parse<rpc::TaskInfo::State, false>(text, "task", out);
}
Status ParseState(std::string_view text, rpc::PlacementGroupRecord::State* out) {
  return Parse<rpc::PlacementGroupRecord::State, false>(text, "placement group", out);
}
Status ParseState(std::string_view text, rpc::SliceSummary::State* out) {
  return Parse<rpc::SliceSummary::State, true>(text, "slice", out);
}
Status ParseState(std::string_view text, rpc::WorkerInfo::State* out) {
  return Parse<rpc::WorkerInfo::State, true>(text, "worker", out);
}
Status ParseState(std::string_view text, rpc::ActorRecord::State* out) {
  return Parse<rpc::ActorRecord::State, false>(text, "actor", out);
}
Status ParseState(std::string_view text, rpc::JobProcessInfo::State* out) {
  return Parse<rpc::JobProcessInfo::State, false>(text, "job process", out);
}
Status ParseState(std::string_view text, rpc::JobRecord::State* out) {
  return Parse<rpc::JobRecord::State, false>(text, "job", out);
}

bool IsTerminal(rpc::JobRecord::State s) {
  return s == rpc::JobRecord::SUCCEEDED || s == rpc::JobRecord::FAILED || s == rpc::JobRecord::STOPPED;
}

}  // namespace torus
