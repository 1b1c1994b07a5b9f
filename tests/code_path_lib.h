// Remote functions of the shared library used by code_path_test.cc (see code_path_lib.cc).
#pragma once

#include <string>

std::string CodePathWhoAmI();  // this process' executable
int CodePathPlus(int a, int b);

class CodePathCounter {
 public:
  static CodePathCounter* Create(int start);
  explicit CodePathCounter(int start) : n_(start) {}
  int Add(int x);
  std::string WhoAmI();

 private:
  int n_;
};
