"""`python -m benchmarks`: the index of the benchmarks, one line each (their docstrings)."""

from benchmarks.common import module_index

if __name__ == "__main__":
    print(module_index("benchmarks"))
