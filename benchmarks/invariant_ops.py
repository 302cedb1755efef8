"""`python -m benchmarks.invariant_ops`: the invariant ops' H200 checks and timings against the
stock PyTorch ops they replace (same run). The work lives in `benchmarks.invariant_gpu_check`."""

from benchmarks.invariant_gpu_check import main

if __name__ == "__main__":
    main()
