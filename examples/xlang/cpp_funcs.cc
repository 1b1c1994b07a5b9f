// C++ functions a Python driver calls with torus.cross_language.cpp_function("Plus"): built as a
// shared library that C++ workers load from the job's code search path.
#include <ray/api.h>

int Plus(int a, int b) { return a + b; }
std::string Concat(std::string a, std::string b) { return a + b; }
RAY_REMOTE(Plus, Concat);
