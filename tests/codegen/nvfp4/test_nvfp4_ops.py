"""fp4_compile:: NVFP4 ops, CPU implementation (= the reference).

Tiers: bitwise (quantize op vs reference, batch invariance, grouped == per-expert loop);
error budget from a float64 oracle (autograd); integration (opcheck, torch.compile fullgraph,
torch.export).
"""

import pytest
import torch

import fp4_compile.codegen as cg
from fp4_compile import NVFP4Recipe, QuantSpec
from fp4_compile import reference as ref
from fp4_compile.codegen.nvfp4 import gemm as impl
from fp4_compile.sr_stream import nth_call_seed, set_sr_state, site_seed
from fp4_compile.testing import assert_bitwise_equal, assert_nvfp4_equal

STRICT = NVFP4Recipe.strict()
BATCH_SIZES = (1, 2, 3, 7, 16, 64, 129, 256)


def _x(*shape, dtype=torch.bfloat16, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=g) * torch.logspace(-3, 2, shape[-1])).to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    "block,mode",
    [
        ("1x16", "per_row"),
        ("1x16", "per_tensor"),
        ("16x16", "per_tensor"),
        ("1x16", "static"),
        ("16x16", "static"),
    ],
)
def test_quantize_op_bitwise_equals_reference(dtype, block, mode):
    """Bitwise: torch.ops.fp4_compile.quantize == reference.quantize, every mode."""
    x = _x(32, 64, dtype=dtype)
    gs = torch.tensor(7.5) if mode == "static" else mode
    assert_nvfp4_equal(
        cg.quantize_op(x, block=block, global_scale=gs),
        ref.quantize(x, block=block, global_scale=gs),
    )


def test_quantize_op_stochastic_and_experts():
    """Bitwise: stochastic rounding (same seed) and per-expert weights == reference."""
    x = _x(16, 48, dtype=torch.float32)
    for seed in (0, 123):
        assert_nvfp4_equal(
            cg.quantize_op(x, global_scale="per_tensor", rounding="stochastic", seed=seed),
            ref.quantize(x, global_scale="per_tensor", rounding="stochastic", seed=seed),
        )
    w = _x(3, 32, 48, dtype=torch.bfloat16)
    assert_nvfp4_equal(cg.quantize_weight(w, STRICT), ref.quantize_experts(w))


def test_transpose_tiled_equals_quantizing_the_transpose():
    """Bitwise: W and W^T quantize identically with 16x16 tiles (what dgrad relies on)."""
    w = _x(32, 48, dtype=torch.float32)
    wq = ref.quantize(w, block="16x16")
    assert_nvfp4_equal(impl.transpose_tiled(wq), ref.quantize(w.t().contiguous(), block="16x16"))


@pytest.mark.parametrize(
    "recipe",
    [STRICT, NVFP4Recipe.strict(activation=QuantSpec(block="1x16", global_scale="static"))],
    ids=["per_row", "static"],
)
def test_linear_batch_invariance(recipe):
    """Bitwise: row i of nvfp4_linear(x[:m]) == row i of nvfp4_linear(x), and rows at other
    positions (x shifted by 5 rows) are unchanged."""
    x, w, b = _x(256 + 5, 64), _x(48, 64, dtype=torch.float32, seed=1), _x(48, seed=2)
    amax = torch.tensor(50.0)
    wq = cg.quantize_weight(w, recipe)
    full = cg.nvfp4_linear(x[5:], w, b, recipe=recipe, w_q=wq, x_amax=amax)
    shifted = cg.nvfp4_linear(x, w, b, recipe=recipe, w_q=wq, x_amax=amax)[5:]
    assert_bitwise_equal(shifted, full, "rows at shifted positions")
    for m in BATCH_SIZES:
        part = cg.nvfp4_linear(x[5 : 5 + m], w, b, recipe=recipe, w_q=wq, x_amax=amax)
        assert_bitwise_equal(part, full[:m], f"m={m}")


def test_linear_matches_reference_math():
    """Bitwise: the op == ((exact dot) * gd_x) * gd_w + bias, cast to x.dtype (the contract)."""
    x, w, b = _x(3, 5, 64), _x(32, 64, dtype=torch.float32, seed=1), _x(32, seed=2)
    y = cg.nvfp4_linear(x, w, b, recipe=STRICT)
    xq = ref.quantize(x.reshape(-1, 64), global_scale="per_row")
    want = (ref.nvfp4_mm(xq, ref.quantize(w, block="16x16")) + b.float()).to(x.dtype)
    assert_bitwise_equal(y, want.reshape(3, 5, 32))


@pytest.mark.parametrize("shape", [(6, 32, 64), (6, 64, 32)], ids=["gate_up", "down"])
def test_grouped_equals_per_expert_loop(shape):
    """Bitwise: nvfp4_grouped_mm == a loop of nvfp4_linear per expert (empty groups included)."""
    e, n, k = shape
    w = _x(e, n, k, dtype=torch.float32, seed=3)
    offsets = torch.tensor([4, 4, 9, 30, 30, 41], dtype=torch.int32)
    x = _x(41, k)
    wq = cg.quantize_weight(w, STRICT)
    y = cg.nvfp4_grouped_linear(x, w, offsets, recipe=STRICT, w_q=wq)
    start = 0
    for i, end in enumerate(offsets.tolist()):
        if end > start:
            want = cg.nvfp4_linear(
                x[start:end],
                w[i],
                recipe=STRICT,
                w_q=wq[i].__class__(
                    codes=wq.codes[i],
                    block_scales=wq.block_scales[i],
                    global_decode=wq.global_decode[i].reshape(()),
                    shape=(n, k),
                    block="16x16",
                ),
            )
            assert_bitwise_equal(y[start:end], want, f"expert {i}")
        start = end


def _deq64(q):
    return q.on_grid(torch.float64) * q.global_decode.double()


@pytest.mark.parametrize("dgrad,wgrad", [("nvfp4", "nvfp4"), ("bf16", "bf16")])
def test_linear_autograd_vs_float64(dgrad, wgrad):
    """Error budget vs a float64 oracle of the same math: the quantized operands are rebuilt
    with the reference quantizer (same seeds), multiplied in float64; the op may differ by its
    FP32 rounding: |err| <= 8 * 2**-24 * (|A| @ |B|) (bf16 GEMM: 2**-7 relative)."""
    recipe = NVFP4Recipe.strict(dgrad=dgrad, wgrad=wgrad, seed=11)
    m, n, k = 20, 32, 48
    x = _x(m, k, dtype=torch.float32).requires_grad_()
    w = _x(n, k, dtype=torch.float32, seed=1).requires_grad_()
    b = _x(n, dtype=torch.float32, seed=2).requires_grad_()
    dy = _x(m, n, dtype=torch.float32, seed=4)
    set_sr_state(None)
    y = cg.nvfp4_linear(x, w, b, recipe=recipe)
    y.backward(dy)
    seed = nth_call_seed(site_seed(11, 0), 0)  # the first call at site 0 under base seed 11
    wq = ref.quantize(w.detach(), block="16x16")
    if dgrad == "nvfp4":
        a = _deq64(ref.quantize(dy, global_scale="per_tensor", rounding="stochastic", seed=seed))
        bm = _deq64(wq)
        tol_rel = 8 * 2.0**-24
    else:
        a, bm, tol_rel = dy.bfloat16().double(), w.detach().bfloat16().double(), 2.0**-7
    want, bound = a @ bm, (a.abs() @ bm.abs()) * tol_rel + 1e-30
    assert bool(((x.grad.double() - want).abs() <= bound).all()), "dgrad outside budget"
    if wgrad == "nvfp4":
        pad = (-m) % 16
        dyt = torch.nn.functional.pad(dy.t(), (0, pad))
        xt = torch.nn.functional.pad(x.detach().t(), (0, pad))
        a = _deq64(
            ref.quantize(dyt, global_scale="per_tensor", rounding="stochastic", seed=seed + 1)
        )
        bm = _deq64(ref.quantize(xt, global_scale="per_tensor"))
        want, bound = a @ bm.t(), (a.abs() @ bm.abs().t()) * 8 * 2.0**-24 + 1e-30
    else:
        a, bm = dy.bfloat16().double(), x.detach().bfloat16().double()
        want, bound = a.t() @ bm, (a.abs().t() @ bm.abs()) * 2.0**-7 + 1e-30
    assert bool(((w.grad.double() - want).abs() <= bound).all()), "wgrad outside budget"
    assert_bitwise_equal(b.grad, dy.sum(0), "dbias")


def test_grouped_autograd_matches_per_expert_linear():
    """Grouped backward: dW per expert == the dense op's wgrad on that expert's tokens
    (seed + 1 + e), dX == quantized dY (over all T) @ W_e^T within the float64 budget."""
    recipe = NVFP4Recipe.strict(seed=3)
    e, n, k = 3, 32, 48
    w = _x(e, n, k, dtype=torch.float32, seed=5).requires_grad_()
    x = _x(24, k, dtype=torch.float32).requires_grad_()
    offsets = torch.tensor([10, 10, 24], dtype=torch.int32)
    dy = _x(24, n, dtype=torch.float32, seed=6)
    set_sr_state(None)
    cg.nvfp4_grouped_linear(x, w, offsets, recipe=recipe).backward(dy)
    seed = nth_call_seed(site_seed(3, 0), 0)
    for i, s, t in [(0, 0, 10), (2, 10, 24)]:
        want = impl.cpu_wgrad(dy[s:t], x.detach()[s:t], recipe, seed + 1 + i)
        assert_bitwise_equal(w.grad[i], want, f"dW expert {i}")
    assert bool((w.grad[1] == 0).all())
    dyq = _deq64(ref.quantize(dy, global_scale="per_tensor", rounding="stochastic", seed=seed))
    wq = ref.quantize_experts(w.detach())
    for i, s, t in [(0, 0, 10), (2, 10, 24)]:
        bm = _deq64(wq[i])
        want = dyq[s:t] @ bm
        bound = (dyq[s:t].abs() @ bm.abs()) * 8 * 2.0**-24 + 1e-30
        assert bool(((x.grad[s:t].double() - want).abs() <= bound).all()), f"dX expert {i}"


def _linear_args(recipe=STRICT, requires_grad=True):
    x = _x(6, 64, dtype=torch.float32).requires_grad_(requires_grad)
    w = _x(32, 64, dtype=torch.float32, seed=1).requires_grad_(requires_grad)
    b = _x(32, dtype=torch.float32, seed=2).requires_grad_(requires_grad)
    wq = ref.quantize(w.detach(), block="16x16")
    return (
        x,
        w,
        wq.codes,
        wq.block_scales.view(torch.uint8),
        wq.global_decode,
        b,
        None,
        recipe.numerics_key,
        None,
    )


def test_opcheck():
    """torch.library.opcheck: schema, fake tensors, autograd registration, aot dispatch."""
    torch.library.opcheck(torch.ops.fp4_compile.nvfp4_linear.default, _linear_args())
    x = _x(16, 32)
    torch.library.opcheck(
        torch.ops.fp4_compile.quantize.default, (x, "1x16", "per_row", None, "rne", 0)
    )
    w = _x(2, 32, 32, dtype=torch.float32).requires_grad_()
    wq = ref.quantize_experts(w.detach())
    xg = _x(10, 32, dtype=torch.float32).requires_grad_()
    off = torch.tensor([4, 10], dtype=torch.int32)
    torch.library.opcheck(
        torch.ops.fp4_compile.nvfp4_grouped_mm.default,
        (
            xg,
            w,
            wq.codes,
            wq.block_scales.view(torch.uint8),
            wq.global_decode,
            off,
            None,
            STRICT.numerics_key,
            None,
        ),
    )
    # the folded token gather: rows of h through x_index (-1: a zero row), gradient of h
    h = _x(6, 32, dtype=torch.float32).requires_grad_()
    x_index = torch.tensor([0, 5, 2, -1, 2, 4, 1, 0, 3, 5])
    torch.library.opcheck(
        torch.ops.fp4_compile.nvfp4_grouped_mm.default,
        (
            h,
            w,
            wq.codes,
            wq.block_scales.view(torch.uint8),
            wq.global_decode,
            off,
            None,
            STRICT.numerics_key,
            None,
            0,
            x_index,
        ),
    )


@pytest.mark.parametrize("backend", ["eager", "aot_eager", "inductor"])
def test_compile_fullgraph(backend):
    """torch.compile(fullgraph=True) on CPU: forward and backward equal eager bitwise."""
    torch._dynamo.reset()
    x, w, b = (
        _x(8, 64, dtype=torch.float32),
        _x(32, 64, dtype=torch.float32, seed=1),
        _x(32, dtype=torch.float32),
    )
    wq = cg.quantize_weight(w, STRICT)

    def f(x, w, b):
        return cg.nvfp4_linear(x, w, b, recipe=STRICT, w_q=wq) * 2.0  # (a reduction here would
        # be reordered by Inductor; the op itself must match bitwise)

    def run(fn):
        xx, ww = x.clone().requires_grad_(), w.clone().requires_grad_()
        out = fn(xx, ww, b)
        out.sum().backward()
        return out, xx.grad, ww.grad

    eager = run(f)
    compiled = run(torch.compile(f, backend=backend, fullgraph=True))
    for a, c in zip(eager, compiled):
        assert_bitwise_equal(c, a, backend)


def test_compile_quantize_weight_inside_graph():
    """quantize_weight (no w_q) inside a fullgraph-compiled function: no graph break."""
    torch._dynamo.reset()
    x, w = _x(4, 32), _x(16, 32, dtype=torch.float32, seed=1)

    def f(x, w):
        return cg.nvfp4_linear(x, w, recipe=STRICT)

    assert_bitwise_equal(torch.compile(f, backend="aot_eager", fullgraph=True)(x, w), f(x, w))


def test_export():
    """torch.export keeps the op; the exported program equals eager bitwise."""

    class Lin(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(_x(32, 64, dtype=torch.float32, seed=1))

        def forward(self, x):
            return cg.nvfp4_linear(x, self.w, recipe=STRICT)

    mod, x = Lin(), _x(5, 64)
    ep = torch.export.export(mod, (x,))
    targets = {str(n.target) for n in ep.graph.nodes}
    assert "fp4_compile.nvfp4_linear.default" in targets, targets
    assert_bitwise_equal(ep.module()(x), mod(x))


def test_bad_inputs_name_the_argument():
    x, w = _x(4, 64), _x(32, 64, dtype=torch.float32)
    with pytest.raises(ValueError, match="x last dim"):
        cg.nvfp4_linear(x[:, :48], w, recipe=STRICT, w_q=cg.quantize_weight(w, STRICT))
    with pytest.raises(TypeError, match="x must be"):
        cg.nvfp4_linear(x.to(torch.int32), w, recipe=STRICT)
    with pytest.raises(ValueError, match="x_amax"):
        static = NVFP4Recipe.strict(activation=QuantSpec(block="1x16", global_scale="static"))
        cg.nvfp4_linear(x, w, recipe=static)
    with pytest.raises(TypeError, match="offsets"):
        cg.nvfp4_grouped_linear(x, w[None], torch.tensor([4]), recipe=STRICT)
    with pytest.raises(ValueError, match="quantize"):
        cg.nvfp4_linear(x, w, recipe=NVFP4Recipe.bf16())


def test_ongrid_weight_op_equals_on_grid_and_refuses_bad_input():
    """Bitwise: fp4_compile::ongrid_weight == NVFP4Tensor.on_grid(bf16), dense and experts
    (subnormal E4M3 scales included); opcheck; bad inputs name the argument."""
    op = torch.ops.fp4_compile.ongrid_weight.default
    for w in (_x(48, 96, dtype=torch.float32, seed=5), _x(3, 32, 64, dtype=torch.float32)):
        wq = ref.quantize_experts(w) if w.dim() == 3 else ref.quantize(w, block="16x16")
        scales = wq.block_scales.view(torch.uint8)
        got = op(wq.codes, scales)
        assert_bitwise_equal(got, wq.on_grid(torch.bfloat16), f"on-grid {tuple(w.shape)}")
        torch.library.opcheck(op, (wq.codes, scales))
    with pytest.raises(TypeError, match="w_codes"):
        op(scales.view(torch.int8), scales)
    with pytest.raises(ValueError, match="w_scales shape"):
        op(wq.codes, scales[..., :1].contiguous())


def _fake_graph(device: str, rows: int):
    """A graph holding x [rows, 64] and w [32, 64] (fake, on `device`) and one linear of them."""
    import torch.fx as fx
    from torch._subclasses.fake_tensor import FakeTensorMode

    mode = FakeTensorMode()
    graph = fx.Graph()
    x, w = graph.placeholder("x"), graph.placeholder("w")
    with mode:
        x.meta["val"] = torch.empty(rows, 64, device=device, dtype=torch.bfloat16)
        w.meta["val"] = torch.empty(32, 64, device=device, dtype=torch.bfloat16)
        lin = graph.call_function(torch.ops.aten.linear.default, (x, w))
        lin.meta["val"] = torch.empty(rows, 32, device=device, dtype=torch.bfloat16)
    graph.output(lin)
    return graph, x, w, lin


@pytest.mark.parametrize(
    "device,rows,want",
    [
        ("cuda", impl.ONGRID_FORWARD_MIN_ROWS, True),
        ("cuda", impl.ONGRID_FORWARD_MIN_ROWS - 1, False),
        ("cpu", 4096, False),
    ],
)
def test_lowering_passes_the_ongrid_weight_where_the_forward_uses_it(device, rows, want):
    """The lowering makes a weight's on-grid copy ONCE in the graph (its quantize node becomes
    `quantize_with_ongrid`, the copy its 4th output) and passes it as w_ongrid to every NVFP4
    GEMM of it exactly where the forward runs the on-grid GEMM (CUDA, >=
    ONGRID_FORWARD_MIN_ROWS rows at the traced shape), so autograd saves it for the dgrad;
    elsewhere (few rows, CPU) the op decides at run time (w_ongrid None)."""
    import operator

    from fp4_compile.passes.targets import emit_nvfp4_linear, emit_quantize_weight

    ops = torch.ops.fp4_compile
    graph, x, w, lin = _fake_graph(device, rows)
    wq = emit_quantize_weight(graph, w, STRICT)
    a = emit_nvfp4_linear(graph, lin, x, w, wq, None, STRICT)
    b = emit_nvfp4_linear(graph, lin, x, w, wq, None, STRICT)
    q = wq[0].args[0]
    copies = [n for n in graph.nodes if n.target is operator.getitem and n.args[1] == 3]
    assert len(copies) == (1 if want else 0), "one on-grid copy per weight, only where it pays"
    assert q.target is (ops.quantize_with_ongrid.default if want else ops.quantize.default)
    assert a.args[8] is b.args[8] is (copies[0] if want else None)
    if want:
        assert copies[0].args[0] is q
        assert copies[0].meta["val"].shape == (32, 64)
        assert copies[0].meta["val"].dtype == torch.bfloat16
        assert len(q.meta["val"]) == 4
    graph.lint()


def test_quantize_with_ongrid_equals_quantize_then_ongrid_weight():
    """Bitwise: fp4_compile::quantize_with_ongrid == (quantize, ongrid_weight of its bytes),
    dense per tensor and experts per expert; opcheck."""
    ops = torch.ops.fp4_compile
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    for w, mode in ((_x(48, 96, seed=6), "per_tensor"), (_x(3, 32, 64, seed=7), "per_expert")):
        args = (w.to(dev), "16x16", mode, None, "rne", 0)
        codes, scales, gd, ongrid = ops.quantize_with_ongrid(*args)
        want = ops.quantize(*args)
        for got, exp, name in zip((codes, scales, gd), want, ("codes", "scales", "gd")):
            assert_bitwise_equal(got, exp, f"{name} {mode}")
        want_grid = ops.ongrid_weight(want[0], want[1].view(torch.uint8))
        assert_bitwise_equal(ongrid, want_grid, f"on-grid copy {mode}")
        torch.library.opcheck(ops.quantize_with_ongrid.default, args)


def test_save_ongrid_weights_false_drops_the_weight_copy():
    """options['save_ongrid_weights']=False (passes.drop_ongrid_weights): the graph keeps no
    on-grid copy (its quantize node is a plain quantize again) and every NVFP4 GEMM gets
    w_ongrid=None back; a non-bool is refused."""
    import torch.fx as fx

    from fp4_compile.backend import parse_options
    from fp4_compile.passes import drop_ongrid_weights
    from fp4_compile.passes.targets import emit_nvfp4_linear, emit_quantize_weight

    graph, x, w, lin = _fake_graph("cuda", impl.ONGRID_FORWARD_MIN_ROWS)
    wq = emit_quantize_weight(graph, w, STRICT)
    a = emit_nvfp4_linear(graph, lin, x, w, wq, None, STRICT)
    lin.replace_all_uses_with(a)
    graph.erase_node(lin)
    gm = fx.GraphModule(torch.nn.Module(), graph)
    assert a.args[8] is not None
    assert drop_ongrid_weights(gm) == 1
    assert a.args[8] is None
    assert not [
        n for n in gm.graph.nodes if n.target is torch.ops.fp4_compile.ongrid_weight.default
    ]
    assert wq[0].args[0].target is torch.ops.fp4_compile.quantize.default
    assert len(wq[0].args[0].meta["val"]) == 3
    with pytest.raises(TypeError, match="save_ongrid_weights"):
        parse_options({"save_ongrid_weights": 1})
