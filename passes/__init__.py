"""FX graph passes of the `minite` backend, imported as `fp4_compile.passes`.

The ordered pipeline is listed here once the passes exist (select, lower linears, lower MoE,
invariance, verify). Import siblings relatively; never import `rl`.
"""

PIPELINE: tuple = ()
