#include "tpu/node_identity.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <climits>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>

#include "common/text.h"
#include "common/thread_annotations.h"
#include "tpu/chip_visibility.h"

namespace torus::tpu {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

std::optional<int> ParseNonNegativeInt(std::string_view s) {
  s = Trim(s);
  if (s.empty()) return std::nullopt;
  long long value = 0;
  for (char ch : s) {
    if (ch < '0' || ch > '9') return std::nullopt;
    value = value * 10 + (ch - '0');
    if (value > INT_MAX) return std::nullopt;
  }
  return static_cast<int>(value);
}

std::optional<std::string> EnvValue(const EnvMap& env, std::string_view name) {
  auto it = env.find(std::string(name));
  if (it == env.end()) return std::nullopt;
  return it->second;
}

// ---- HTTP client ------------------------------------------------------------------------------

// Owns one file descriptor.
class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }
  int release() {
    int fd = fd_;
    fd_ = -1;
    return fd;
  }

 private:
  int fd_;
};

struct ParsedUrl {
  std::string host;
  std::string port = "80";
  std::string path = "/";
};

std::optional<ParsedUrl> ParseHttpUrl(std::string_view url) {
  constexpr std::string_view kScheme = "http://";
  if (url.size() < kScheme.size() || Lower(url.substr(0, kScheme.size())) != kScheme) {
    return std::nullopt;
  }
  url.remove_prefix(kScheme.size());
  ParsedUrl out;
  size_t slash = url.find('/');
  std::string_view authority = url.substr(0, slash);
  if (slash != std::string_view::npos) out.path = std::string(url.substr(slash));
  if (!authority.empty() && authority.front() == '[') {  // [v6 literal]:port
    size_t close = authority.find(']');
    if (close == std::string_view::npos) return std::nullopt;
    out.host = std::string(authority.substr(1, close - 1));
    std::string_view rest = authority.substr(close + 1);
    if (!rest.empty()) {
      if (rest.front() != ':') return std::nullopt;
      out.port = std::string(rest.substr(1));
    }
  } else {
    size_t colon = authority.rfind(':');
    out.host = std::string(authority.substr(0, colon));
    if (colon != std::string_view::npos) out.port = std::string(authority.substr(colon + 1));
  }
  std::optional<int> port = ParseNonNegativeInt(out.port);
  if (out.host.empty() || !port || *port > 65535) return std::nullopt;
  return out;
}

int MillisLeft(Clock::time_point deadline) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
  return left.count() <= 0 ? 0 : static_cast<int>(std::min<long long>(left.count(), INT_MAX));
}

// One asynchronous name lookup (getaddrinfo_a); glibc reads and writes it until it completes.
struct AsyncLookup {
  std::string host, port;
  addrinfo hints{};
  gaicb cb{};
  ~AsyncLookup() {
    if (cb.ar_result != nullptr) ::freeaddrinfo(cb.ar_result);
  }
};

// Lookups given up at their deadline that glibc could not cancel (already running): kept
// here until glibc is done with them, then freed by a later Reap(). Any thread; `mu_` guards
// the list.
class AbandonedLookups {
 public:
  void Add(std::unique_ptr<AsyncLookup> l) EXCLUDES(mu_) {
    MutexLock lock(mu_);
    lookups_.push_back(std::move(l));
  }
  void Reap() EXCLUDES(mu_) {
    MutexLock lock(mu_);
    std::erase_if(lookups_, [](const auto& l) { return ::gai_error(&l->cb) != EAI_INPROGRESS; });
  }

 private:
  Mutex mu_;
  std::vector<std::unique_ptr<AsyncLookup>> lookups_ GUARDED_BY(mu_);
};

// Leaked on purpose: lookups may still be in glibc's hands at exit.
AbandonedLookups& Abandoned() {
  static auto* a = new AbandonedLookups;
  return *a;
}

// Resolves host:port to socket addresses before `deadline`. Numeric hosts resolve inline; names
// go through glibc's asynchronous getaddrinfo_a (its helper threads are the C library's own),
// since getaddrinfo has no timeout of its own: waited for until the deadline, then cancelled
// (or, when already running, left to finish in AbandonedLookups).
std::vector<sockaddr_storage> Resolve(const std::string& host, const std::string& port,
                                      Clock::time_point deadline) {
  std::vector<sockaddr_storage> out;
  auto collect = [&out](addrinfo* list) {
    for (addrinfo* ai = list; ai != nullptr; ai = ai->ai_next) {
      if (ai->ai_addrlen > sizeof(sockaddr_storage)) continue;
      sockaddr_storage ss{};
      std::memcpy(&ss, ai->ai_addr, ai->ai_addrlen);
      out.push_back(ss);
    }
  };
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICHOST | AI_NUMERICSERV;
  addrinfo* list = nullptr;
  if (::getaddrinfo(host.c_str(), port.c_str(), &hints, &list) == 0) {
    collect(list);
    ::freeaddrinfo(list);
    return out;
  }

  Abandoned().Reap();
  auto l = std::make_unique<AsyncLookup>();
  l->host = host;
  l->port = port;
  l->hints.ai_family = AF_UNSPEC;
  l->hints.ai_socktype = SOCK_STREAM;
  l->hints.ai_flags = AI_NUMERICSERV;
  l->cb.ar_name = l->host.c_str();
  l->cb.ar_service = l->port.c_str();
  l->cb.ar_request = &l->hints;
  gaicb* requests[1] = {&l->cb};
  if (::getaddrinfo_a(GAI_NOWAIT, requests, 1, nullptr) != 0) return out;  // treat as no server
  while (::gai_error(&l->cb) == EAI_INPROGRESS) {
    const int ms = MillisLeft(deadline);
    if (ms <= 0) break;
    const timespec left{ms / 1000, (ms % 1000) * 1000000L};
    ::gai_suspend(requests, 1, &left);  // returns on completion, timeout or a signal
  }
  const int status = ::gai_error(&l->cb);
  if (status == 0) {
    collect(l->cb.ar_result);
  } else if (status == EAI_INPROGRESS && ::gai_cancel(&l->cb) == EAI_NOTCANCELED) {
    Abandoned().Add(std::move(l));
  }
  return out;
}

// Connects to the first reachable address before `deadline`; -1 on failure.
int ConnectAny(const std::vector<sockaddr_storage>& addrs, Clock::time_point deadline) {
  for (const sockaddr_storage& ss : addrs) {
    const socklen_t len = ss.ss_family == AF_INET6 ? sizeof(sockaddr_in6) : sizeof(sockaddr_in);
    int fd = ::socket(ss.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) continue;
    Fd guard(fd);
    int rc = ::connect(fd, reinterpret_cast<const sockaddr*>(&ss), len);
    if (rc != 0 && errno != EINPROGRESS) continue;
    if (rc != 0) {
      pollfd pfd{fd, POLLOUT, 0};
      int n;
      do {
        n = ::poll(&pfd, 1, MillisLeft(deadline));
      } while (n < 0 && errno == EINTR);
      if (n <= 0) return -1;  // timeout: no time left for other addresses
      int err = 0;
      socklen_t err_len = sizeof(err);
      if (::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &err_len) != 0 || err != 0) continue;
    }
    return guard.release();
  }
  return -1;
}

bool SendAll(int fd, std::string_view data, Clock::time_point deadline) {
  while (!data.empty()) {
    ssize_t n = ::send(fd, data.data(), data.size(), MSG_NOSIGNAL);
    if (n > 0) {
      data.remove_prefix(static_cast<size_t>(n));
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      pollfd pfd{fd, POLLOUT, 0};
      if (::poll(&pfd, 1, MillisLeft(deadline)) <= 0) return false;
      continue;
    }
    return false;
  }
  return true;
}

// Decodes a complete chunked body; nullopt while incomplete or malformed.
std::optional<std::string> DecodeChunked(std::string_view body) {
  std::string out;
  while (true) {
    size_t eol = body.find("\r\n");
    if (eol == std::string_view::npos) return std::nullopt;
    std::string_view size_line = body.substr(0, body.find_first_of(";\r"));
    size_t size = 0;
    if (size_line.empty()) return std::nullopt;
    for (char ch : size_line) {
      int digit = std::isdigit(static_cast<unsigned char>(ch)) ? ch - '0'
                  : (ch >= 'a' && ch <= 'f')                   ? ch - 'a' + 10
                  : (ch >= 'A' && ch <= 'F')                   ? ch - 'A' + 10
                                                               : -1;
      if (digit < 0 || size > (1u << 24)) return std::nullopt;
      size = size * 16 + static_cast<size_t>(digit);
    }
    body.remove_prefix(eol + 2);
    if (size == 0) return out;  // trailers ignored
    if (body.size() < size + 2) return std::nullopt;
    out.append(body.substr(0, size));
    body.remove_prefix(size + 2);
  }
}

struct HttpResponse {
  int status = 0;
  std::string body;
};

// Parses `raw` as a full response. Returns nullopt while more bytes are needed (when
// `eof` is false) or when the response is malformed.
std::optional<HttpResponse> ParseResponse(std::string_view raw, bool eof) {
  size_t header_end = raw.find("\r\n\r\n");
  if (header_end == std::string_view::npos) return std::nullopt;
  std::string_view head = raw.substr(0, header_end);
  std::string_view body = raw.substr(header_end + 4);
  size_t eol = head.find("\r\n");
  std::string_view status_line = head.substr(0, eol);
  // "HTTP/1.1 200 OK"
  if (status_line.substr(0, 5) != "HTTP/") return std::nullopt;
  size_t sp = status_line.find(' ');
  if (sp == std::string_view::npos) return std::nullopt;
  std::optional<int> status = ParseNonNegativeInt(status_line.substr(sp + 1, 3));
  if (!status) return std::nullopt;

  std::optional<size_t> content_length;
  bool chunked = false;
  std::string_view headers = eol == std::string_view::npos ? "" : head.substr(eol + 2);
  while (!headers.empty()) {
    size_t line_end = headers.find("\r\n");
    std::string_view line = headers.substr(0, line_end);
    headers = line_end == std::string_view::npos ? "" : headers.substr(line_end + 2);
    size_t colon = line.find(':');
    if (colon == std::string_view::npos) continue;
    std::string name = Lower(Trim(line.substr(0, colon)));
    std::string value = Lower(Trim(line.substr(colon + 1)));
    if (name == "content-length") {
      std::optional<int> n = ParseNonNegativeInt(value);
      if (!n) return std::nullopt;
      content_length = static_cast<size_t>(*n);
    } else if (name == "transfer-encoding" && value.find("chunked") != std::string::npos) {
      chunked = true;
    }
  }
  HttpResponse response;
  response.status = *status;
  if (chunked) {
    std::optional<std::string> decoded = DecodeChunked(body);
    if (!decoded) return std::nullopt;
    response.body = std::move(*decoded);
  } else if (content_length) {
    if (body.size() < *content_length) return std::nullopt;
    response.body = std::string(body.substr(0, *content_length));
  } else {
    if (!eof) return std::nullopt;  // body runs to the end of the connection
    response.body = std::string(body);
  }
  return response;
}

std::optional<std::string> HttpGet(const std::string& url, std::chrono::milliseconds timeout) {
  constexpr size_t kMaxResponseBytes = 1 << 20;
  const Clock::time_point deadline = Clock::now() + timeout;
  std::optional<ParsedUrl> parsed = ParseHttpUrl(url);
  if (!parsed) return std::nullopt;
  std::vector<sockaddr_storage> addrs = Resolve(parsed->host, parsed->port, deadline);
  if (addrs.empty()) return std::nullopt;
  int raw_fd = ConnectAny(addrs, deadline);
  if (raw_fd < 0) return std::nullopt;
  Fd fd(raw_fd);

  std::string host_header = parsed->host.find(':') != std::string::npos
                                ? "[" + parsed->host + "]:" + parsed->port
                                : parsed->host + ":" + parsed->port;
  std::string request = "GET " + parsed->path + " HTTP/1.1\r\nHost: " + host_header +
                        "\r\nMetadata-Flavor: Google\r\nAccept: */*\r\nConnection: close\r\n\r\n";
  if (!SendAll(fd.get(), request, deadline)) return std::nullopt;

  std::string raw;
  char buf[4096];
  while (true) {
    pollfd pfd{fd.get(), POLLIN, 0};
    int n = ::poll(&pfd, 1, MillisLeft(deadline));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return std::nullopt;  // timeout or poll failure
    ssize_t got = ::recv(fd.get(), buf, sizeof(buf), 0);
    if (got < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) continue;
    if (got < 0) return std::nullopt;
    const bool eof = got == 0;
    raw.append(buf, static_cast<size_t>(got));
    if (raw.size() > kMaxResponseBytes) return std::nullopt;
    std::optional<HttpResponse> response = ParseResponse(raw, eof);
    if (response) {
      if (response->status != 200 || response->body.empty()) return std::nullopt;
      return std::move(response->body);
    }
    if (eof) return std::nullopt;  // truncated or malformed
  }
}

// ---- Device tree ------------------------------------------------------------------------------

bool IsNonDirectoryAccel(const fs::directory_entry& entry) {
  const std::string name = entry.path().filename().string();
  if (name.rfind("accel", 0) != 0) return false;
  std::error_code ec;
  return !entry.is_directory(ec) && !ec;
}

bool GroupHasGoogleDevice(const fs::path& group_devices) {
  std::error_code ec;
  fs::directory_iterator it(group_devices, ec);
  if (ec) return false;
  for (const fs::directory_entry& device : it) {
    std::ifstream vendor(device.path() / "vendor");
    std::string value;
    if (vendor && std::getline(vendor, value) && Lower(Trim(value)) == "0x1ae0") return true;
  }
  return false;
}

// ---- Identity helpers ---------------------------------------------------------------------

// Parses TPU_VISIBLE_CHIPS: comma-separated non-negative ids; "" lists no chips.
std::optional<std::vector<int>> ParseVisibleChips(std::string_view value) {
  std::vector<int> ids;
  if (Trim(value).empty()) return ids;
  size_t start = 0;
  while (true) {
    size_t comma = value.find(',', start);
    std::optional<int> id = ParseNonNegativeInt(value.substr(
        start, comma == std::string_view::npos ? std::string_view::npos : comma - start));
    if (!id) return std::nullopt;
    ids.push_back(*id);
    if (comma == std::string_view::npos) break;
    start = comma + 1;
  }
  return ids;
}

std::string FormatAmount(double v) {
  std::ostringstream out;
  out << v;
  return out.str();
}

}  // namespace

MetadataFetcher HttpMetadataFetcher(std::string base_url, std::chrono::milliseconds timeout) {
  if (base_url.empty() || base_url.back() != '/') base_url += '/';
  return [base_url = std::move(base_url), timeout](const std::string& key) {
    return HttpGet(base_url + key, timeout);
  };
}

MetadataFetcher MetadataFetcherFromEnv(const EnvMap& env) {
  std::optional<std::string> url = EnvValue(env, "TORUS_TPU_METADATA_URL");
  if (!url) return HttpMetadataFetcher(std::string(kDefaultMetadataBaseUrl));
  if (Lower(Trim(*url)) == "off") return MetadataFetcher();
  return HttpMetadataFetcher(std::string(Trim(*url)));
}

std::optional<std::string> ParseTpuEnvTopology(std::string_view tpu_env) {
  while (!tpu_env.empty()) {
    size_t eol = tpu_env.find('\n');
    std::string_view line = Trim(tpu_env.substr(0, eol));
    tpu_env = eol == std::string_view::npos ? "" : tpu_env.substr(eol + 1);
    size_t colon = line.find(':');
    if (colon == std::string_view::npos || Trim(line.substr(0, colon)) != "TOPOLOGY") continue;
    std::string_view value = Trim(line.substr(colon + 1));
    if (value.size() >= 2 && (value.front() == '\'' || value.front() == '"') &&
        value.back() == value.front()) {
      value = Trim(value.substr(1, value.size() - 2));
    }
    if (value.empty()) return std::nullopt;
    return Lower(value);
  }
  return std::nullopt;
}

int CountTpuChipsInDeviceTree(const std::string& device_root) {
  const fs::path root(device_root.empty() ? "/" : device_root);
  std::error_code ec;
  int accel = 0;
  fs::directory_iterator dev(root / "dev", ec);
  if (!ec) {
    for (const fs::directory_entry& entry : dev) {
      if (IsNonDirectoryAccel(entry)) ++accel;
    }
  }
  if (accel > 0) return accel;

  int groups = 0;
  fs::directory_iterator vfio(root / "dev" / "vfio", ec);
  if (ec) return 0;
  for (const fs::directory_entry& entry : vfio) {
    const std::string name = entry.path().filename().string();
    if (!ParseNonNegativeInt(name) || name != Trim(name)) continue;  // skips /dev/vfio/vfio
    if (GroupHasGoogleDevice(root / "sys" / "kernel" / "iommu_groups" / name / "devices")) {
      ++groups;
    }
  }
  return groups;
}

NodeTpuInput NodeTpuInputFromEnv(EnvMap env, std::optional<double> explicit_tpu) {
  NodeTpuInput input;
  input.device_root = EnvValue(env, "TORUS_TPU_DEVICE_ROOT").value_or("");
  input.metadata = MetadataFetcherFromEnv(env);
  input.env = std::move(env);
  input.explicit_tpu = explicit_tpu;
  return input;
}

namespace {

// The chip count and physical chip ids (§4): explicit TPU, else TORUS_TPU_CHIPS, else the device
// tree; TPU_VISIBLE_CHIPS caps the count and supplies the ids. Fails only on a bad explicit TPU.
Status ResolveChips(const NodeTpuInput& input, NodeTpuIdentity* id) {
  std::optional<std::vector<int>> visible;
  if (std::optional<std::string> v = EnvValue(input.env, kEnvVisibleChips)) {
    visible = ParseVisibleChips(*v);
    if (!visible) {
      id->warnings.push_back("ignoring malformed TPU_VISIBLE_CHIPS '" + *v + "'");
    }
  }
  int chips = 0;
  if (input.explicit_tpu.has_value()) {
    const double requested = *input.explicit_tpu;
    if (!(requested >= 0) || requested != std::floor(requested) || requested > INT_MAX) {
      return InvalidArgument("TPU in the node's resources must be a non-negative integer, got " +
                             FormatAmount(requested));
    }
    chips = static_cast<int>(requested);
    if (visible && chips > static_cast<int>(visible->size())) {
      return InvalidArgument("node requests " + std::to_string(chips) +
                             " TPU chips but TPU_VISIBLE_CHIPS lists only " +
                             std::to_string(visible->size()) + " visible chips");
    }
  } else {
    std::optional<int> overridden;
    if (std::optional<std::string> v = EnvValue(input.env, "TORUS_TPU_CHIPS")) {
      overridden = ParseNonNegativeInt(*v);
      if (!overridden) id->warnings.push_back("ignoring malformed TORUS_TPU_CHIPS '" + *v + "'");
    }
    chips = overridden ? *overridden : CountTpuChipsInDeviceTree(input.device_root);
  }
  if (visible) {
    chips = std::min(chips, static_cast<int>(visible->size()));
    id->chip_ids.assign(visible->begin(), visible->begin() + chips);
  } else {
    for (int i = 0; i < chips; ++i) id->chip_ids.push_back(i);
  }
  id->chips = chips;
  return Status::Ok();
}

// Where an identity field comes from: an environment variable first, then a metadata attribute.
struct FieldSources {
  const NodeTpuInput& input;
  std::optional<std::string> Env(const char* name) const { return EnvValue(input.env, name); }
  std::optional<std::string> Metadata(const char* key) const {
    if (!input.metadata) return std::nullopt;
    return input.metadata(key);
  }
};

// Pod type (§3.5).
void ResolvePodType(const FieldSources& src, NodeTpuIdentity* id) {
  for (int source = 0; source < 2 && !id->pod_type; ++source) {
    std::optional<std::string> raw = source == 0 ? src.Env("TPU_ACCELERATOR_TYPE") : src.Metadata("accelerator-type");
    if (!raw) continue;
    StatusOr<PodType> parsed = ParsePodType(*raw);
    if (parsed.ok()) {
      id->pod_type = *parsed;
    } else {
      id->warnings.push_back(std::string(source == 0 ? "TPU_ACCELERATOR_TYPE" : "metadata accelerator-type") +
                             ": " + parsed.status().message());
    }
  }
}

// Slice name: non-empty.
void ResolveSliceName(const FieldSources& src, NodeTpuIdentity* id) {
  for (int source = 0; source < 2 && !id->slice_name; ++source) {
    std::optional<std::string> raw = source == 0 ? src.Env("TPU_NAME") : src.Metadata("instance-id");
    if (!raw) continue;
    std::string name(Trim(*raw));
    if (!name.empty()) {
      id->slice_name = name;
    } else {
      id->warnings.push_back(source == 0 ? "ignoring empty TPU_NAME" : "ignoring empty metadata instance-id");
    }
  }
}

// Worker id: non-negative integer.
void ResolveWorkerId(const FieldSources& src, NodeTpuIdentity* id) {
  for (int source = 0; source < 2 && !id->worker_id; ++source) {
    std::optional<std::string> raw = source == 0 ? src.Env("TPU_WORKER_ID") : src.Metadata("agent-worker-number");
    if (!raw) continue;
    id->worker_id = ParseNonNegativeInt(*raw);
    if (!id->worker_id) {
      id->warnings.push_back(std::string(source == 0 ? "TPU_WORKER_ID" : "metadata agent-worker-number") +
                             ": ignoring '" + *raw + "', not a non-negative integer");
    }
  }
}

// Topology: §3.1 parse only (membership is not checked on the node side).
void ResolveTopology(const FieldSources& src, NodeTpuIdentity* id) {
  for (int source = 0; source < 2 && !id->topology; ++source) {
    std::optional<std::string> raw;
    if (source == 0) {
      raw = src.Env("TPU_TOPOLOGY");
    } else if (std::optional<std::string> tpu_env = src.Metadata("tpu-env")) {
      raw = ParseTpuEnvTopology(*tpu_env);
    }
    if (!raw) continue;
    if (ParseTopology(*raw).ok()) {
      id->topology = NormalizeTopology(*raw);
    } else {
      id->warnings.push_back(std::string(source == 0 ? "TPU_TOPOLOGY" : "metadata tpu-env") +
                             ": ignoring invalid topology '" + *raw + "'");
    }
  }
}

// Worker host names: informational; §3.6 H is authoritative.
void ReadWorkerHostnames(const EnvMap& env, NodeTpuIdentity* id) {
  std::optional<std::string> raw = EnvValue(env, "TPU_WORKER_HOSTNAMES");
  if (!raw) return;
  std::string_view rest = *raw;
  while (true) {
    size_t comma = rest.find(',');
    std::string_view name = Trim(rest.substr(0, comma));
    if (!name.empty()) id->worker_hostnames.emplace_back(name);
    if (comma == std::string_view::npos) break;
    rest.remove_prefix(comma + 1);
  }
}

// H of the slice from the pod type, checked against the host names and the worker id.
void ResolveSliceHosts(NodeTpuIdentity* id) {
  if (!id->pod_type) return;
  id->slice_hosts = HostsOfSliceFromNode(id->chips, *id->pod_type);
  id->single_host = id->slice_hosts == 1;
  if (!id->worker_hostnames.empty() && static_cast<int>(id->worker_hostnames.size()) != id->slice_hosts) {
    id->warnings.push_back("TPU_WORKER_HOSTNAMES lists " + std::to_string(id->worker_hostnames.size()) +
                           " hosts but pod type " + id->pod_type->normalized + " on a " +
                           std::to_string(id->chips) + "-chip node gives " + std::to_string(id->slice_hosts) +
                           "; using " + std::to_string(id->slice_hosts));
  }
  if (id->worker_id && *id->worker_id >= id->slice_hosts) {
    id->warnings.push_back("TPU_WORKER_ID " + std::to_string(*id->worker_id) + " is outside the slice's " +
                           std::to_string(id->slice_hosts) + " hosts");
  }
}

void SetLabels(NodeTpuIdentity* id) {
  if (id->pod_type) {
    id->labels[std::string(kLabelAcceleratorType)] = AcceleratorTypeValue(id->pod_type->gen);
    id->labels[std::string(kLabelPodType)] = id->pod_type->normalized;
  }
  if (id->slice_name) id->labels[std::string(kLabelSliceName)] = *id->slice_name;
  if (id->worker_id) id->labels[std::string(kLabelWorkerId)] = std::to_string(*id->worker_id);
  if (id->topology) id->labels[std::string(kLabelTopology)] = *id->topology;
}

void SetResources(NodeTpuIdentity* id) {
  id->resources["TPU"] = id->chips;
  if (!id->pod_type) return;
  id->resources["accelerator_type:" + AcceleratorTypeValue(id->pod_type->gen)] = 1;
  const std::string head = "TPU-" + id->pod_type->normalized + "-head";
  if (id->slice_name && (id->worker_id || id->single_host)) {
    id->resources[*id->slice_name] = 1;
    // A single-host slice is its own host 0.
    if (id->single_host || *id->worker_id == 0) id->resources[head] = 1;
  } else if (!id->slice_name && id->single_host) {
    id->anonymous_slice = true;
    id->resources[head] = 1;
  }
}

}  // namespace

StatusOr<NodeTpuIdentity> ComputeNodeTpuIdentity(const NodeTpuInput& input) {
  NodeTpuIdentity id;
  if (auto s = ResolveChips(input, &id); !s.ok()) return s;
  if (id.chips <= 0) return id;  // not a TPU node: no identity, labels or resources
  // Identity fields: environment first, then metadata (only for TPU nodes).
  const FieldSources src{input};
  ResolvePodType(src, &id);
  ResolveSliceName(src, &id);
  ResolveWorkerId(src, &id);
  ResolveTopology(src, &id);
  ReadWorkerHostnames(input.env, &id);
  ResolveSliceHosts(&id);
  SetLabels(&id);
  SetResources(&id);
  return id;
}

Status ValidateUserNodeLabels(const std::map<std::string, std::string>& labels) {
  for (const auto& [key, value] : labels) {
    if (IsReservedTpuLabelKey(key)) {
      return InvalidArgument("node label key '" + key +
                             "' is reserved for TPU identity and cannot be set by the user");
    }
  }
  return Status::Ok();
}

}  // namespace torus::tpu
