"""Modules that stand in for `ray.*` modules whose Torus counterpart has no other home."""
