// Remote functions in a shared library, for the code-search-path test: the driver links this
// library, and the workers (`torus worker`) load it from RayConfig::code_search_path.
#include <unistd.h>

#include <climits>
#include <ray/api.h>
#include <string>

#include "code_path_lib.h"

std::string CodePathWhoAmI() {
  char buf[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
  return n > 0 ? std::string(buf, static_cast<size_t>(n)) : std::string();
}

int CodePathPlus(int a, int b) { return a + b; }

CodePathCounter* CodePathCounter::Create(int start) { return new CodePathCounter(start); }
int CodePathCounter::Add(int x) { return n_ += x; }
std::string CodePathCounter::WhoAmI() { return CodePathWhoAmI(); }

RAY_REMOTE(CodePathWhoAmI, CodePathPlus, CodePathCounter::Create, &CodePathCounter::Add,
           &CodePathCounter::WhoAmI);
