// TaskExecutor over an in-process stream: the hand-back of tasks queued behind a blocked one
// (YieldQueuedTasks, ResultBatch.requeue_from, TaskBatch.resume_from).
#include "core/task_executor.h"

#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "core/executor.h"
#include "core/in_process_task_stream.h"

namespace torus::core {
namespace {

using std::chrono::milliseconds;

// A host with nothing behind it: no borrows, no store, no node.
class BareHost : public TaskExecutor::Host {
 public:
  void WaitReady() override {}
  void EnterTask(const rpc::TaskSpec&) override {}
  std::vector<std::string> PinArgBorrows(const rpc::TaskSpec&) override { return {}; }
  void UnpinArgBorrows(const std::vector<std::string>&) override {}
  void RemoveLocalReference(const std::string&) override {}
  StatusOr<std::shared_ptr<internal::Buffer>> Materialize(const rpc::ObjectLocation&,
                                                          const std::string&) override {
    return Status(StatusCode::kInternal, "no store here");
  }
  std::shared_ptr<internal::Buffer> GetOne(const std::string&) override { return nullptr; }
  StatusOr<rpc::ObjectLocation> StoreLarge(const rpc::TaskSpec&, int, size_t,
                                           const std::function<void(char*)>&) override {
    return Status(StatusCode::kInternal, "no store here");
  }
  void RegisterResultBorrows(const std::string&, std::vector<std::string>,
                             google::protobuf::RepeatedPtrField<std::string>*) override {}
  void ReportActorExit(const std::string&) override {}
  void ExitSoon(milliseconds) override {}
  void ReturnLease(const std::string&) override {}
  bool NodeGone(milliseconds) override { return false; }
};

// Records what ran; a task named "block" hands back what is queued behind it (as a task that
// calls ray.get does) and waits until released.
class RecordingExecutor : public Executor {
 public:
  StatusOr<TaskOutput> Invoke(const rpc::TaskSpec& spec, const std::vector<internal::ArgView>&,
                              const std::vector<std::shared_ptr<internal::Buffer>>&) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      ran_.push_back(spec.function());
    }
    if (spec.function() == "block") {
      YieldQueuedTasks();
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return released_; });
    }
    return TaskOutput::One(spec.function());
  }
  void Release() {
    std::lock_guard<std::mutex> lock(mu_);
    released_ = true;
    cv_.notify_all();
  }
  std::vector<std::string> Ran() {
    std::lock_guard<std::mutex> lock(mu_);
    return ran_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::string> ran_;
  bool released_ = false;
};

rpc::TaskSpec Task(const std::string& fn, int n) {
  rpc::TaskSpec s;
  s.set_function(fn);
  s.set_task_id(std::string(16, static_cast<char>('a' + n)));
  s.set_return_id(std::string(28, static_cast<char>('a' + n)));
  s.set_num_returns(1);
  return s;
}

std::vector<std::string> Functions(const rpc::ResultBatch& b) {
  std::vector<std::string> out;
  for (const auto& r : b.results()) out.push_back(r.is_error() ? "error: " + r.error().message() : r.task_id());
  return out;
}

// The submitter queued tasks for the stream before the hand-back reached it; their copies are
// written after it (one of them in the batch that resumes). The worker must run none of them
// (the submitter runs them elsewhere, under the same attempt: running one here too stored its
// result twice, "object key ... exists"), and must run what comes from the resume position on.
TEST(TaskExecutorTest, HandedBackTasksWrittenLateAreSkippedEvenInTheResumingBatch) {
  BareHost host;
  auto exec = std::make_unique<RecordingExecutor>();
  RecordingExecutor* rec = exec.get();
  TaskExecutor ex(&host, std::move(exec));
  InProcessTaskStream stream;
  std::thread server([&] { EXPECT_TRUE(ex.ServeTasks(&stream).ok()); });

  rpc::TaskBatch first;
  first.set_lease_id("lease-1");
  *first.add_tasks() = Task("block", 1);   // position 1
  *first.add_tasks() = Task("queued", 2);  // position 2: behind the blocked task
  stream.Send(first);

  rpc::ResultBatch notice;
  ASSERT_TRUE(stream.Take(&notice, milliseconds(10000)));
  EXPECT_EQ(notice.requeue_from(), 2u);
  EXPECT_EQ(notice.results_size(), 0);

  rpc::TaskBatch late;  // position 3: assigned before the submitter saw the hand-back
  *late.add_tasks() = Task("late", 3);
  stream.Send(late);
  rec->Release();
  rpc::ResultBatch blocked;
  ASSERT_TRUE(stream.Take(&blocked, milliseconds(10000)));
  ASSERT_EQ(blocked.results_size(), 1);
  EXPECT_EQ(blocked.results(0).task_id(), Task("block", 1).task_id());

  rpc::TaskBatch resume;  // the submitter resumes at 5; position 4 is a late copy
  resume.set_resume_from(5);
  *resume.add_tasks() = Task("late-in-resume", 4);
  *resume.add_tasks() = Task("after", 5);
  stream.Send(resume);
  rpc::ResultBatch after;
  ASSERT_TRUE(stream.Take(&after, milliseconds(10000)));
  EXPECT_EQ(Functions(after), std::vector<std::string>{Task("after", 5).task_id()});

  rpc::TaskBatch next;  // and it keeps running what follows
  *next.add_tasks() = Task("next", 6);
  stream.Send(next);
  rpc::ResultBatch next_r;
  ASSERT_TRUE(stream.Take(&next_r, milliseconds(10000)));
  EXPECT_EQ(Functions(next_r), std::vector<std::string>{Task("next", 6).task_id()});

  stream.CloseWrites();
  server.join();
  EXPECT_EQ(rec->Ran(), (std::vector<std::string>{"block", "after", "next"}));
}

// A resume position that arrives in a batch of its own before the late copies: they are
// still skipped, by position.
TEST(TaskExecutorTest, ResumePositionAppliesToLaterBatches) {
  BareHost host;
  auto exec = std::make_unique<RecordingExecutor>();
  RecordingExecutor* rec = exec.get();
  TaskExecutor ex(&host, std::move(exec));
  InProcessTaskStream stream;
  std::thread server([&] { EXPECT_TRUE(ex.ServeTasks(&stream).ok()); });

  rpc::TaskBatch first;
  first.set_lease_id("lease-2");
  *first.add_tasks() = Task("block", 1);
  stream.Send(first);
  rpc::ResultBatch notice;
  ASSERT_TRUE(stream.Take(&notice, milliseconds(10000)));
  EXPECT_EQ(notice.requeue_from(), 2u);
  rpc::TaskBatch queued;
  *queued.add_tasks() = Task("queued", 2);
  stream.Send(queued);
  rec->Release();
  rpc::ResultBatch blocked;
  ASSERT_TRUE(stream.Take(&blocked, milliseconds(10000)));
  rpc::TaskBatch resume;
  resume.set_resume_from(4);
  *resume.add_tasks() = Task("late", 3);
  stream.Send(resume);
  rpc::TaskBatch next;
  *next.add_tasks() = Task("next", 4);
  stream.Send(next);
  rpc::ResultBatch r;
  ASSERT_TRUE(stream.Take(&r, milliseconds(10000)));
  EXPECT_EQ(Functions(r), std::vector<std::string>{Task("next", 4).task_id()});
  stream.CloseWrites();
  server.join();
  EXPECT_EQ(rec->Ran(), (std::vector<std::string>{"block", "next"}));
}

}  // namespace
}  // namespace torus::core
