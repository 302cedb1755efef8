"""The `minite train` and `minite export` commands (argument parsing; the work is in `train`)."""
