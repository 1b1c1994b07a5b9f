#include "common/head_addresses.h"

#include <algorithm>
#include <functional>

namespace torus {

std::vector<std::string> HeadAddresses::Split(const std::string& list) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= list.size()) {
    size_t comma = list.find(',', start);
    if (comma == std::string::npos) comma = list.size();
    std::string part = list.substr(start, comma - start);
    if (!part.empty() && std::find(out.begin(), out.end(), part) == out.end()) out.push_back(part);
    start = comma + 1;
  }
  return out;
}

HeadAddresses::HeadAddresses(const std::string& given) : all_(Split(given)) {
  if (all_.empty()) all_.push_back(given);
}

std::string HeadAddresses::current() const {
  MutexLock lock(mu_);
  return all_[current_];
}

std::string HeadAddresses::Failed(const std::string& failed) {
  MutexLock lock(mu_);
  if (all_[current_] == failed) current_ = (current_ + 1) % all_.size();
  return all_[current_];
}

void HeadAddresses::Learn(const std::vector<std::string>& heads, uint64_t version) {
  if (heads.empty()) return;
  MutexLock lock(mu_);
  std::vector<std::string> all = heads;
  for (const auto& a : all_) {
    if (std::find(all.begin(), all.end(), a) == all.end()) all.push_back(a);
  }
  all_ = std::move(all);
  current_ = 0;
  version_ = version;
}

uint64_t HeadAddresses::version() const {
  MutexLock lock(mu_);
  return version_;
}

std::string HeadAddresses::joined() const {
  MutexLock lock(mu_);
  std::string out = all_[current_];
  for (size_t i = 0; i < all_.size(); ++i) {
    if (i != current_) out += "," + all_[i];
  }
  return out;
}

uint64_t HeadAddresses::VersionOf(const std::vector<std::string>& heads) {
  std::string joined;
  for (const auto& h : heads) joined += h + ",";
  uint64_t v = std::hash<std::string>()(joined);
  return v ? v : 1;
}

}  // namespace torus
