"""Python code that examples/xlang/main.cc (a C++ driver) calls by module and name."""


def add(a, b):
    return a + b


def greet(name):
    return "hello " + name


def fail():
    raise ValueError("raised in Python on purpose")


class Counter:
    def __init__(self, start):
        self.n = start

    def add(self, k):
        self.n += k
        return self.n
