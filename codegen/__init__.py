"""Triton kernels and their launchers, imported as `fp4_compile.codegen`.

Triton is imported lazily by the kernel modules, never by this package's import. Never imports
`fp4_compile.rl`.
"""
