"""`python -m tools`: the index of the investigation tools, one line each (their docstrings)."""

from benchmarks.common import module_index

if __name__ == "__main__":
    print(module_index("tools"))
