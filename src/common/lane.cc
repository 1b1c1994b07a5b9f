// The lane's framing, shared by both ends (lane_frame.h).
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "common/lane_frame.h"

namespace torus {

int LaneInbox::Next(uint32_t kinds, LaneHeader* h, std::string_view* text, std::string_view* payload,
                    std::string* why) {
  if (len_ - pos_ < sizeof(LaneHeader)) return 0;
  memcpy(h, data_.get() + pos_, sizeof *h);
  if (h->magic != kLaneMagic || h->kind > 31 || !(kinds & (1u << h->kind)) || h->text_len > kLaneMaxText ||
      h->payload_len > kLaneMaxPayload ||
      ((h->kind == kLaneCall || h->kind == kLaneOpen) && h->text_len == 0)) {
    *why = "malformed frame (magic " + std::to_string(h->magic) + ", kind " + std::to_string(h->kind) +
           ", text " + std::to_string(h->text_len) + " bytes, payload " + std::to_string(h->payload_len) +
           " bytes)";
    return -1;
  }
  size_t total = sizeof(LaneHeader) + h->text_len + h->payload_len;
  if (len_ - pos_ < total) {
    if (cap_ - pos_ < total) Make(total);
    return 0;
  }
  const char* p = data_.get() + pos_ + sizeof(LaneHeader);
  *text = std::string_view(p, h->text_len);
  *payload = std::string_view(p + h->text_len, h->payload_len);
  pos_ += total;
  return 1;
}

void LaneInbox::Append(std::string_view bytes) {
  if (bytes.empty()) return;
  Make(len_ - pos_ + bytes.size());
  memcpy(data_.get() + len_, bytes.data(), bytes.size());
  len_ += bytes.size();
}

ssize_t LaneInbox::Fill(int fd, bool wait) {
  if (pos_ == len_) pos_ = len_ = 0;
  if (cap_ - len_ < 1024) Make(len_ - pos_ + kChunk);
  while (true) {
    ssize_t k = recv(fd, data_.get() + len_, cap_ - len_, wait ? 0 : MSG_DONTWAIT);
    if (k < 0 && errno == EINTR) continue;
    if (k > 0) len_ += static_cast<size_t>(k);
    return k;
  }
}

void LaneInbox::Make(size_t n) {
  if (pos_ > 0) {
    memmove(data_.get(), data_.get() + pos_, len_ - pos_);
    len_ -= pos_;
    pos_ = 0;
  }
  if (cap_ < n) {
    size_t cap = std::max(cap_ * 2, n);
    std::unique_ptr<char[]> d(new char[cap]);
    if (len_ > 0) memcpy(d.get(), data_.get(), len_);
    data_ = std::move(d);
    cap_ = cap;
  }
}

namespace lane_internal {

bool SplitHostPort(const std::string& address, std::string* host, std::string* port) {
  auto colon = address.rfind(':');
  if (colon == std::string::npos) return false;
  *host = address.substr(0, colon);
  *port = address.substr(colon + 1);
  if (host->size() >= 2 && host->front() == '[' && host->back() == ']') {
    *host = host->substr(1, host->size() - 2);
  }
  return !host->empty() && !port->empty();
}

int64_t MsLeft(Clock::time_point deadline) {
  return std::max<int64_t>(
      0, std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count());
}

bool SendFrame(int fd, LaneKind kind, uint16_t code, std::string_view text, std::string_view payload) {
  LaneHeader h{kLaneMagic, kind, 0, code, static_cast<uint32_t>(text.size()),
               static_cast<uint32_t>(payload.size())};
  iovec iov[3] = {{&h, sizeof h},
                  {const_cast<char*>(text.data()), text.size()},
                  {const_cast<char*>(payload.data()), payload.size()}};
  int first = 0;
  while (first < 3) {
    msghdr m{};
    m.msg_iov = iov + first;
    m.msg_iovlen = 3 - first;
    ssize_t n = sendmsg(fd, &m, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    while (first < 3 && static_cast<size_t>(n) >= iov[first].iov_len) {
      n -= static_cast<ssize_t>(iov[first].iov_len);
      ++first;
    }
    if (first < 3) {
      iov[first].iov_base = static_cast<char*>(iov[first].iov_base) + n;
      iov[first].iov_len -= static_cast<size_t>(n);
    }
  }
  return true;
}

int ReadFull(int fd, void* buf, size_t n, const Clock::time_point* deadline) {
  size_t got = 0;
  while (got < n) {
    if (deadline) {
      pollfd p{fd, POLLIN, 0};
      int r = poll(&p, 1, static_cast<int>(std::min<int64_t>(MsLeft(*deadline), 1 << 30)));
      if (r < 0 && errno == EINTR) continue;
      if (r == 0) return -2;
      if (r < 0) return -1;
    }
    ssize_t k = read(fd, static_cast<char*>(buf) + got, n - got);
    if (k < 0 && errno == EINTR) continue;
    if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return -2;  // SO_RCVTIMEO
    if (k == 0) return got == 0 ? 0 : -1;
    if (k < 0) return -1;
    got += static_cast<size_t>(k);
  }
  return 1;
}

std::string PeerName(int fd) {
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  if (getpeername(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) return "?";
  char host[NI_MAXHOST], port[NI_MAXSERV];
  if (getnameinfo(reinterpret_cast<sockaddr*>(&ss), len, host, sizeof host, port, sizeof port,
                  NI_NUMERICHOST | NI_NUMERICSERV) != 0) {
    return "?";
  }
  return std::string(host) + ":" + port;
}

bool SendMessage(int fd, std::mutex& mu, std::string& buf, const google::protobuf::MessageLite& m) {
  std::lock_guard<std::mutex> lock(mu);
  buf.clear();
  if (!m.AppendToString(&buf)) return false;
  return SendFrame(fd, kLaneMsg, 0, {}, buf);
}

}  // namespace lane_internal
}  // namespace torus
