// Cross-language calls from a C++ driver into Python code, with Ray's C++ API names.
//
//   PYTHONPATH=examples/xlang TORUS_PYTHON_WORKER_COMMAND='["python3","-m","torus._private.worker_main"]' \
//     build/example_xlang
//
// The Python workers import examples/xlang/xlang_funcs.py by module name; the interpreter must
// have the torus package installed (pip install .). Prints the results and exits 1 on a wrong
// value.
#include <ray/api.h>

int main(int argc, char** argv) {
  ray::RayConfig config;
  ray::Init(config, argc, argv);
  int failures = 0;
  auto check = [&](const char* what, int64_t got, int64_t want) {
    std::cout << what << " = " << got << (got == want ? "" : "  (WRONG)") << "\n";
    failures += got != want;
  };
  auto sum = ray::Task(ray::PyFunction<int64_t>{"xlang_funcs", "add"}).Remote(1, 2);
  check("python add(1, 2)", *ray::Get(sum), 3);
  auto text = ray::Task(ray::PyFunction<std::string>{"xlang_funcs", "greet"}).Remote(std::string("torus"));
  std::cout << "python greet(\"torus\") = " << *ray::Get(text) << "\n";
  failures += *ray::Get(text) != "hello torus";
  ray::ActorHandleXlang counter = ray::Actor(ray::PyActorClass{"xlang_funcs", "Counter"}).Remote(10);
  auto n1 = counter.Task(ray::PyActorMethod<int64_t>{"add"}).Remote(5);
  auto n2 = counter.Task(ray::PyActorMethod<int64_t>{"add"}).Remote(7);
  check("Counter(10).add(5)", *ray::Get(n1), 15);
  check("then add(7)", *ray::Get(n2), 22);
  try {
    ray::Get(ray::Task(ray::PyFunction<int64_t>{"xlang_funcs", "fail"}).Remote());
    std::cout << "python fail(): no exception (WRONG)\n";
    failures++;
  } catch (const ray::internal::RayException& e) {
    std::cout << "python fail() raised, seen in C++: " << e.what() << "\n";
  }
  ray::Shutdown();
  return failures == 0 ? 0 : 1;
}
