"""Torus Data's internals: the logical plan, the streaming executor and the work it runs."""
