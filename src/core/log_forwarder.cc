#include "core/log_forwarder.h"

#include <poll.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>

#include "common/rpc.h"
#include "proto/torus.grpc.pb.h"

namespace torus::core {

LogForwarder::LogForwarder(Identity id, std::function<std::string()> driver_address)
    : id_(std::move(id)), driver_address_(std::move(driver_address)) {}

bool LogForwarder::Start() {
  if (pipe(stop_pipe_) != 0) return false;
  for (int fd : {STDOUT_FILENO, STDERR_FILENO}) {
    int pipefd[2];
    if (pipe(pipefd) != 0) break;
    int log_fd = dup(fd);
    dup2(pipefd[1], fd);
    close(pipefd[1]);
    log_fds_[fd - STDOUT_FILENO] = log_fd;
    threads_.emplace_back(
        [this, read_fd = pipefd[0], log_fd, is_err = fd == STDERR_FILENO] { ReadLoop(read_fd, log_fd, is_err); });
  }
  threads_.emplace_back([this] { ForwardLoop(); });
  return log_fds_[1] >= 0;
}

void LogForwarder::Stop() {
  if (threads_.empty()) return;
  for (int i = 0; i < 2; ++i) {
    if (log_fds_[i] >= 0) dup2(log_fds_[i], STDOUT_FILENO + i);  // the pipe's write end closes
  }
  close(stop_pipe_[1]);  // wakes a reader kept from EOF by a child holding the pipe
  {
    MutexLock l(mu_);
    stopping_ = true;
    cv_.NotifyAll();
  }
  for (auto& t : threads_) t.join();
  threads_.clear();
  close(stop_pipe_[0]);
}

void LogForwarder::ReadLoop(int read_fd, int log_fd, bool is_err) {
  char buf[8192];
  std::string partial;
  pollfd fds[2] = {{read_fd, POLLIN, 0}, {stop_pipe_[0], POLLIN, 0}};
  while (true) {
    fds[0].revents = fds[1].revents = 0;
    if (poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      break;
    }
    if (!(fds[0].revents & (POLLIN | POLLHUP | POLLERR))) {
      if (fds[1].revents) break;  // stopping
      continue;
    }
    ssize_t n = read(read_fd, buf, sizeof buf);
    if (n <= 0) break;
    (void)!write(log_fd, buf, n);
    partial.append(buf, n);
    size_t pos;
    MutexLock l(mu_);
    bool any = false;
    while ((pos = partial.find('\n')) != std::string::npos) {
      (is_err ? err_lines_ : out_lines_).push_back(partial.substr(0, pos));
      partial.erase(0, pos + 1);
      any = true;
    }
    if (any) cv_.NotifyOne();
  }
  close(read_fd);
}

void LogForwarder::ForwardLoop() {
  while (true) {
    rpc::LogBatch batch;
    {
      MutexLock l(mu_);
      while (out_lines_.empty() && err_lines_.empty() && !stopping_) cv_.Wait(l);
      if (out_lines_.empty() && err_lines_.empty()) return;  // stopping
      // Let the lines of a burst gather into one call.
      auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(20);
      while (!stopping_ && cv_.WaitUntil(l, until)) {
      }
      for (auto& line : out_lines_) batch.add_stdout_lines(std::move(line));
      for (auto& line : err_lines_) batch.add_stderr_lines(std::move(line));
      out_lines_.clear();
      err_lines_.clear();
    }
    std::string target = driver_address_();
    if (target.empty()) continue;  // nobody to show it to yet: it is in the log files already
    batch.set_worker_id(id_.worker_id);
    batch.set_pid(getpid());
    batch.set_node_id(id_.node_id);
    rpc::Empty e;
    auto ctx = NewContext(id_.token, 2000);
    (void)rpc::CoreWorker::NewStub(GetChannel(target))->PrintLogs(ctx.get(), batch, &e);
  }
}

}  // namespace torus::core
