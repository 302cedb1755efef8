"""The elementwise-numerics probe (`tools.elementwise_numerics_gpu`, the GPU question of
the bf16 30B-shaped backend row) on CPU, small shapes: Inductor with minite's settings rounds
the model's traced elementwise subgraphs (SwiGLU, rotary with in-graph cos / sin, residual adds)
exactly like eager, forward and every input gradient, as the CPU suite's compiled == eager
tests need; and the probe reports each candidate with its counts."""

import torch


def test_probe_finds_no_difference_on_cpu():
    from tools.elementwise_numerics_gpu import probe

    rows = probe(64, torch.device("cpu"), small=True)
    assert [r["candidate"].split()[0] for r in rows] == ["MoE", "rotary", "residual", "fix:"]
    for r in rows:
        assert "error" not in r, r
        assert r["forward_bytes_differ"] == 0, r
        assert r["grad_bytes_differ"] == [0] * len(r["grad_elements"]), r
        assert all(n > 0 for n in r["grad_elements"])
