// A Ray C++ program, unchanged: a Plus task, a Counter actor, Put/Get. Builds against Torus with
// find_package(Torus) (see CMakeLists.txt here) or against Ray's C++ package.
#include <ray/api.h>

#include <chrono>
#include <cstdlib>
#include <iostream>
#include <thread>
#include <set>
#include <string>
#include <vector>

int Plus(int x, int y) {
  std::cout << "Plus(" << x << ", " << y << ") running in a worker" << std::endl;
  return x + y;
}

// Long enough (100 ms) that the scheduler spreads these over every node instead of packing.
std::string WhereAmI() {
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  const char* n = std::getenv("TORUS_NODE_ID");
  return n ? n : "?";
}
RAY_REMOTE(Plus, WhereAmI);

class Counter {
 public:
  explicit Counter(int init) : count_(init) {}
  static Counter* FactoryCreate(int init) { return new Counter(init); }
  int Add(int x) {
    count_ += x;
    return count_;
  }

 private:
  int count_;
};
RAY_REMOTE(Counter::FactoryCreate, &Counter::Add);

int main(int argc, char** argv) {
  ray::Init();

  auto obj = ray::Put(100);
  std::cout << "put_get_result = " << *ray::Get(obj) << std::endl;

  auto task = ray::Task(Plus).Remote(1, 2);
  std::cout << "task_result = " << *ray::Get(task) << std::endl;

  ray::ActorHandle<Counter> counter = ray::Actor(Counter::FactoryCreate).Remote(0);
  std::cout << "actor_result = " << *ray::Get(counter.Task(&Counter::Add).Remote(3)) << std::endl;
  std::cout << "actor_result_with_ref = " << *ray::Get(counter.Task(&Counter::Add).Remote(task))
            << std::endl;

  // Spread work: report how many distinct nodes ran tasks.
  std::vector<ray::ObjectRef<std::string>> where;
  for (int i = 0; i < 12; ++i) where.push_back(ray::Task(WhereAmI).Remote());
  std::set<std::string> nodes;
  for (auto& s : ray::Get(where)) nodes.insert(*s);
  std::cout << "nodes_used = " << nodes.size() << std::endl;

  ray::Shutdown();
  return 0;
}
