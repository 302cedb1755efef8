"""NVFP4 checkpoint export (`fp4_compile.export_checkpoint`), checked against the formats' owners.

Contracts (bitwise tier):
- the exported codes / block scales are the learner graph's bytes (`learner_weight_bytes`), byte
  for byte, and the global scales decode to the learner's global decode scale bit for bit; the
  shards of a fused group (q/k/v, gate/up) carry one global scale (shared_weight_scale);
- compressed-tensors' own `NVFP4PackedCompressor.decompress` (BF16 output) equals minite's
  dequantized weight cast to BF16, bitwise; the FP32 values through our reader equal
  `fp4_compile.dequantize` bitwise;
- the ModelOpt file's tensors decode (e2m1 x weight_scale x weight_scale_2) to the same values;
- `load_nvfp4_checkpoint` gives back a model whose linears are those dequantized values and whose
  other tensors are the originals.
"""

from __future__ import annotations

import json
import warnings

import pytest
import torch

pytest.importorskip("transformers", reason="checkpoint export needs the `hf` extra")

import fp4_compile  # noqa: E402
from fp4_compile.checkpoints.load import decode_weight  # noqa: E402
from fp4_compile.models import tiny_qwen3, tiny_qwen3_moe  # noqa: E402
from fp4_compile.testing import assert_bitwise_equal, learner_weight_bytes  # noqa: E402

RECIPE = fp4_compile.NVFP4Recipe.strict()
MODELS = {"dense": tiny_qwen3, "moe": tiny_qwen3_moe}


def _export(model, path, fmt, recipe=RECIPE):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fp4_compile.export_checkpoint(model, path, format=fmt, recipe=recipe)
    return [str(w.message) for w in caught]


def _learner_linears(model, recipe=RECIPE) -> dict[str, tuple[torch.Tensor, ...]]:
    """module name -> (codes, E4M3 scales, global decode []) as the learner's lowered graph
    quantizes it in a forward (`learner_weight_bytes`), fused experts split per expert like the
    export."""
    ids = torch.randint(
        0, model.config.vocab_size, (2, 8), generator=torch.Generator().manual_seed(0)
    )
    learner = learner_weight_bytes(model, recipe, ids, use_cache=False)
    out = {}
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Linear) and "lm_head" not in name:
            c, s, g = learner[f"{name}.weight"]
            out[name] = (c, s, g.reshape(()))
        elif hasattr(module, "gate_up_proj"):
            inter = module.gate_up_proj.shape[1] // 2
            cg, sg, gg = learner[f"{name}.gate_up_proj"]
            cd, sd, gdn = learner[f"{name}.down_proj"]
            for e in range(cg.shape[0]):
                g = gg.reshape(-1)[e]
                out[f"{name}.{e}.gate_proj"] = (cg[e, :inter], sg[e, :inter], g)
                out[f"{name}.{e}.up_proj"] = (cg[e, inter:], sg[e, inter:], g)
                out[f"{name}.{e}.down_proj"] = (cd[e], sd[e], gdn.reshape(-1)[e])
    return out


def _dequantized(codes, scales, gd) -> torch.Tensor:
    """minite's dequantized weight, FP32: (e2m1 x E4M3, exact) x global decode."""
    t = fp4_compile.NVFP4Tensor(
        codes=codes,
        block_scales=scales,
        global_decode=gd,
        shape=(codes.shape[0], 2 * codes.shape[1]),
    )
    return fp4_compile.dequantize(t, torch.float32)


def _tensors(path):
    from safetensors.torch import load_file

    return load_file(str(path / "model.safetensors"))


@pytest.mark.parametrize("kind", sorted(MODELS))
def test_compressed_tensors_bytes_are_the_learners(tmp_path, kind):
    """Bitwise: weight_packed / weight_scale are the learner graph's bytes byte for byte;
    fp32(1 / weight_global_scale) is the learner's global decode bit for bit; the shards of each
    fused group (q/k/v, gate/up) carry one global scale (the recipe's shared_weight_scale), so no
    fused-group warning fires; the config names the scheme the format defines; the activation
    warning fires."""
    model = MODELS[kind]()
    messages = _export(model, tmp_path / "ct", "compressed-tensors")
    tensors = _tensors(tmp_path / "ct")
    learner = _learner_linears(model)
    assert learner
    for name, (codes, scales, gd) in learner.items():
        assert_bitwise_equal(tensors[f"{name}.weight_packed"], codes, f"{name} codes")
        assert_bitwise_equal(tensors[f"{name}.weight_scale"], scales, f"{name} scales")
        ge = tensors[f"{name}.weight_global_scale"]
        assert ge.shape == (1,) and ge.dtype == torch.float32
        assert_bitwise_equal(torch.ones(()) / ge.reshape(()), gd, f"{name} 1/global_scale")
        assert tensors[f"{name}.input_global_scale"].shape == (1,)
        assert f"{name}.weight" not in tensors
    assert "lm_head.weight" in tensors and tensors["lm_head.weight"].dtype == torch.float32
    config = json.loads((tmp_path / "ct" / "config.json").read_text())
    qc = config["quantization_config"]
    assert qc["quant_method"] == "compressed-tensors" and qc["format"] == "nvfp4-pack-quantized"
    w = qc["config_groups"]["group_0"]["weights"]
    assert (w["num_bits"], w["type"], w["strategy"], w["group_size"], w["symmetric"]) == (
        4,
        "float",
        "tensor_group",
        16,
        True,
    )
    assert qc["config_groups"]["group_0"]["input_activations"]["dynamic"] == "local"
    assert "lm_head" in qc["ignore"]
    assert qc["minite"]["fingerprint"] == RECIPE.fingerprint()
    assert qc["minite"]["activation_global_scale"] == "per_row"
    assert any("per_row" in m and "W4A16" in m for m in messages), messages
    assert qc["minite"]["fused_groups_with_different_global_scales"] == []
    assert not any("ONE global scale" in m for m in messages), messages
    groups = [("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj")]
    checked = 0
    for name in learner:
        parent, _, leaf = name.rpartition(".")
        for group in groups:
            if leaf == group[0] and all(f"{parent}.{g}" in learner for g in group):
                scales = [tensors[f"{parent}.{g}.weight_global_scale"] for g in group]
                for g, ge in zip(group, scales):
                    assert_bitwise_equal(ge, scales[0], f"{parent}.{g} global scale")
                checked += 1
    assert checked >= 2, checked  # every layer's q/k/v (and, dense, gate/up)


def test_without_shared_scale_export_warns_about_fused_groups(tmp_path):
    """With shared_weight_scale=False each of q/k/v and gate/up has its own global scale (the
    learner's bytes still, bitwise): export names the groups in the config and warns once."""
    recipe = RECIPE.with_(shared_weight_scale=False)
    model = tiny_qwen3(layers=1)
    messages = _export(model, tmp_path / "ct", "compressed-tensors", recipe)
    tensors = _tensors(tmp_path / "ct")
    for name, (codes, scales, gd) in _learner_linears(model, recipe).items():
        assert_bitwise_equal(tensors[f"{name}.weight_packed"], codes, f"{name} codes")
        assert_bitwise_equal(tensors[f"{name}.weight_scale"], scales, f"{name} scales")
        ge = tensors[f"{name}.weight_global_scale"].reshape(())
        assert_bitwise_equal(torch.ones(()) / ge, gd, f"{name} 1/global_scale")
    qc = json.loads((tmp_path / "ct" / "config.json").read_text())["quantization_config"]
    mismatched = qc["minite"]["fused_groups_with_different_global_scales"]
    assert any("q_proj" in g for g in mismatched)  # random q/k/v get different amaxes
    assert any("ONE global scale" in m for m in messages), messages


@pytest.mark.parametrize("kind", sorted(MODELS))
def test_compressed_tensors_decompressor_matches_minite(tmp_path, kind):
    """Bitwise, format owner: compressed-tensors' NVFP4PackedCompressor.decompress of every
    exported linear (it returns BF16: it unpacks to BF16 and casts its FP32 product back) equals
    minite's FP32 dequantized weight cast to BF16; the FP32 values through our reader equal it
    bitwise; the written quantization_config parses as a compressed-tensors QuantizationConfig."""
    pytest.importorskip("compressed_tensors", reason="needs the `ct` extra (compressed-tensors)")
    from compressed_tensors.compressors.nvfp4.base import NVFP4PackedCompressor
    from compressed_tensors.quantization import QuantizationConfig

    model = MODELS[kind]()
    _export(model, tmp_path / "ct", "compressed-tensors")
    tensors = _tensors(tmp_path / "ct")
    qc = json.loads((tmp_path / "ct" / "config.json").read_text())["quantization_config"]
    qc = {k: v for k, v in qc.items() if k != "minite"}
    scheme = QuantizationConfig.model_validate(qc).config_groups["group_0"]
    for name, (codes, scales, gd) in _learner_linears(model).items():
        local = {
            s: tensors[f"{name}.{s}"]
            for s in ("weight_packed", "weight_scale", "weight_global_scale", "input_global_scale")
        }
        theirs = NVFP4PackedCompressor.decompress(local, scheme)["weight"]
        ours = _dequantized(codes, scales, gd)
        assert theirs.dtype == torch.bfloat16, theirs.dtype
        assert_bitwise_equal(theirs, ours.to(torch.bfloat16), f"{name} (compressed-tensors, BF16)")
        reader = decode_weight(
            local["weight_packed"],
            local["weight_scale"],
            torch.ones(()) / local["weight_global_scale"].reshape(()),
        )
        assert_bitwise_equal(reader, ours, f"{name} (our reader, FP32)")


@pytest.mark.parametrize("kind", sorted(MODELS))
def test_modelopt_tensors_decode_to_the_same_values(tmp_path, kind):
    """Bitwise: ModelOpt `weight` / `weight_scale` are the learner's bytes, `weight_scale_2` its
    global decode, and e2m1 x weight_scale x weight_scale_2 equals minite's dequantized weight;
    hf_quant_config.json says NVFP4, group 16, lm_head excluded."""
    model = MODELS[kind]()
    _export(model, tmp_path / "mo", "modelopt")
    tensors = _tensors(tmp_path / "mo")
    for name, (codes, scales, gd) in _learner_linears(model).items():
        assert_bitwise_equal(tensors[f"{name}.weight"], codes, f"{name} codes")
        assert_bitwise_equal(tensors[f"{name}.weight_scale"], scales, f"{name} scales")
        assert_bitwise_equal(tensors[f"{name}.weight_scale_2"], gd, f"{name} weight_scale_2")
        assert tensors[f"{name}.input_scale"].dtype == torch.float32
        decoded = decode_weight(
            tensors[f"{name}.weight"],
            tensors[f"{name}.weight_scale"],
            tensors[f"{name}.weight_scale_2"],
        )
        assert_bitwise_equal(decoded, _dequantized(codes, scales, gd), f"{name} decoded")
    hf = json.loads((tmp_path / "mo" / "hf_quant_config.json").read_text())["quantization"]
    assert hf["quant_algo"] == "NVFP4" and hf["group_size"] == 16
    assert "lm_head" in hf["exclude_modules"]
    qc = json.loads((tmp_path / "mo" / "config.json").read_text())["quantization_config"]
    assert qc["quant_method"] == "modelopt" and qc["quant_algo"] == "NVFP4"


@pytest.mark.parametrize("fmt", ["compressed-tensors", "modelopt"])
@pytest.mark.parametrize("kind", sorted(MODELS))
def test_load_round_trip(tmp_path, kind, fmt):
    """Bitwise: load_nvfp4_checkpoint gives a model whose quantized linears are minite's
    dequantized weights (experts re-fused) and whose other tensors equal the original's."""
    model = MODELS[kind]()
    _export(model, tmp_path / "out", fmt)
    back = fp4_compile.load_nvfp4_checkpoint(tmp_path / "out")
    assert type(back) is type(model)
    state = back.state_dict()
    learner = _learner_linears(model)
    for name, tensor in model.state_dict().items():
        module = name.removesuffix(".weight")
        if module in learner:
            want = _dequantized(*learner[module])
        elif name.endswith("gate_up_proj"):
            path = name.removesuffix(".gate_up_proj")
            num_experts = tensor.shape[0]
            want = torch.stack(
                [
                    torch.cat(
                        [
                            _dequantized(*learner[f"{path}.{e}.{p}"])
                            for p in ("gate_proj", "up_proj")
                        ]
                    )
                    for e in range(num_experts)
                ]
            )
        elif name.endswith("down_proj") and tensor.dim() == 3:
            path = name.removesuffix(".down_proj")
            want = torch.stack(
                [_dequantized(*learner[f"{path}.{e}.down_proj"]) for e in range(tensor.shape[0])]
            )
        else:
            want = tensor
        assert_bitwise_equal(state[name], want, name)


def test_errors_name_the_argument(tmp_path):
    """An unknown format and a non-empty foreign folder are refused with a ValueError naming
    the argument; an earlier export is overwritten."""
    model = tiny_qwen3(layers=1)
    with pytest.raises(ValueError, match="format must be one of"):
        fp4_compile.export_checkpoint(model, tmp_path / "a", format="gguf")
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    with pytest.raises(ValueError, match="path .*non-empty folder"):
        fp4_compile.export_checkpoint(model, foreign)
    _export(model, tmp_path / "again", "modelopt")
    _export(model, tmp_path / "again", "modelopt")  # an earlier export: overwritten
    with pytest.raises(ValueError, match="quantizes no linear"):
        fp4_compile.export_checkpoint(model, tmp_path / "b", recipe="bf16")


def test_cli_export_of_a_grpo_checkpoint(tmp_path):
    """`minite export RUN_DIR --format ... --out DIR` rebuilds the policy from a trainer-format
    checkpoint (runs/NAME/checkpoints/step_*.ckpt) and writes the same tensors, bitwise, as
    export_checkpoint on that policy."""
    from safetensors.torch import load_file

    from fp4_compile.cli import main
    from fp4_compile.rl.train.checkpoint import save_checkpoint, step_path
    from fp4_compile.rl.train.config import TrainConfig, build_model

    cfg = TrainConfig(arch="qwen3_moe", layers=1, device="cpu")
    model = build_model(cfg, 32)
    state = {
        "step": 3,
        "model": model.state_dict(),
        "recipe": RECIPE.to_dict(),
        "config": cfg.to_dict(),
        "tokenizer": {"chars": "0123456789"},
    }
    run = tmp_path / "runs" / "toy"
    save_checkpoint(step_path(run / "checkpoints", 3), state, kind="grpo")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert (
            main(["export", str(run), "--format", "modelopt", "--out", str(tmp_path / "cli")]) == 0
        )
    _export(model, tmp_path / "api", "modelopt")
    got, want = load_file(str(tmp_path / "cli" / "model.safetensors")), _tensors(tmp_path / "api")
    assert sorted(got) == sorted(want)
    for name in want:
        assert_bitwise_equal(got[name], want[name], name)
    assert (tmp_path / "cli" / "minite_tokenizer.json").is_file()
    assert (
        main(
            [
                "export",
                str(tmp_path / "nothing"),
                "--format",
                "modelopt",
                "--out",
                str(tmp_path / "x"),
            ]
        )
        == 2
    )
