"""Wiring: the declarative rows, users' hook files and their expressions, and the one installer that puts the
target table's and the hook files' rows on vLLM's code. Above the handlers it builds, below the instrumentor."""
