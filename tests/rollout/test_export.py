"""export_rollout / load_rollout: the exported rollout graph comes from the same lowering (op
census equal to the learner's), round-trips through disk, and refuses corrupt, foreign or
mismatched artifacts. Engine from the artifact == engine from the model, bitwise."""

import json

import pytest
import torch

import fp4_compile
from fp4_compile import NVFP4Recipe
from fp4_compile.backend import lowering_only_backend
from fp4_compile.models import tiny_qwen3
from fp4_compile.passes.verify import normalized_census
from fp4_compile.rl import RolloutEngine
from fp4_compile.rollout import RolloutArtifactError, load_rollout
from fp4_compile.testing import assert_bitwise_equal


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    model = tiny_qwen3(layers=2).eval()
    path = tmp_path_factory.mktemp("rollout")
    artifact = fp4_compile.export_rollout(
        model, recipe=NVFP4Recipe.strict(), path=path, max_batch=8, max_seq_len=48
    )
    return model, artifact, path


def test_census_equals_learner_forward(exported):
    model, artifact, _ = exported
    (report,) = fp4_compile.explain(
        model, torch.randint(0, 128, (2, 8)), use_cache=False, print_report=False
    )
    assert normalized_census(artifact.census) == normalized_census(report.census)
    assert "fp4_compile::nvfp4_linear" in artifact.census


def test_census_equals_learner_training_forward(exported):
    """Contract: the exported step computes what the learner's TRAINING forward (grad on, whose
    graphs keep cos and sin: `fuse_rotary_tables` takes no-grad graphs only) computes, its
    inference-only fused forms counted as the ops they replace."""
    model, artifact, _ = exported
    reports: list = []
    torch._dynamo.reset()
    try:
        compiled = torch.compile(
            model, backend=lowering_only_backend(NVFP4Recipe.strict(), reports), fullgraph=True
        )
        with torch.enable_grad():
            compiled(torch.randint(0, 128, (2, 8)), use_cache=False)
    finally:
        torch._dynamo.reset()
    (report,) = reports
    assert not any(n.startswith("fp4_compile::rotary_tables") for n in report.census)
    assert any(n.startswith("fp4_compile::rotary_tables") for n in artifact.census)
    assert normalized_census(artifact.census) == normalized_census(report.census)


def test_manifest_contents(exported):
    _, artifact, path = exported
    manifest = json.loads((path / "manifest.json").read_text())
    assert manifest["fingerprint"] == NVFP4Recipe.strict().fingerprint()
    assert set(manifest["files"]) == {"rollout.pt2", "weights.safetensors", "model_config.json"}
    assert manifest["versions"]["torch"] == torch.__version__
    from safetensors.torch import load_file

    weights = load_file(str(path / "weights.safetensors"))
    assert any(k.endswith(".nvfp4.codes") for k in weights)


def test_engine_from_artifact_equals_engine_from_model(exported):
    model, _, path = exported
    prompts = [[1, 2, 3], [4, 5, 6, 7, 8], [9]]
    a = RolloutEngine(model, recipe=NVFP4Recipe.strict(), max_batch=8, max_seq_len=48).generate(
        prompts, max_new_tokens=8, seed=3
    )
    engine = RolloutEngine(path, expected_fingerprint=NVFP4Recipe.strict().fingerprint())
    b = engine.generate(prompts, max_new_tokens=8, seed=3)
    assert a.tokens == b.tokens
    for x, y in zip(a.logprobs, b.logprobs):
        assert_bitwise_equal(x, y, "artifact vs model engine")
    # the artifact's weight quantizes read the engine's weight store: q, k, v, o, gate, up, down
    ops = torch.ops.fp4_compile
    weight_ops = (
        ops.quantize.default,
        ops.quantize_with_ongrid.default,
        ops.weight_group_amax.default,
    )
    assert engine.weight_store.sites_bound == 7 * 2
    assert not [n for n in engine.step.graph.nodes if n.target in weight_ops]


def test_refuses_other_fingerprint(exported):
    _, _, path = exported
    with pytest.raises(RolloutArtifactError, match="differ from the learner"):
        load_rollout(path, expected_fingerprint=NVFP4Recipe.te().fingerprint())


def test_refuses_corrupt_file(exported, tmp_path):
    _, _, path = exported
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(path, copy)
    with open(copy / "weights.safetensors", "r+b") as f:
        f.seek(200)
        f.write(b"\x00\x01\x02")
    with pytest.raises(RolloutArtifactError, match="corrupt"):
        load_rollout(copy)


def test_refuses_other_architecture(exported, tmp_path):
    _, _, path = exported
    import shutil

    copy = tmp_path / "arch"
    shutil.copytree(path, copy)
    manifest = json.loads((copy / "manifest.json").read_text())
    manifest["arch"] = "sm_100"
    (copy / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(RolloutArtifactError, match="exported for sm_100"):
        load_rollout(copy)


def test_refuses_an_older_recipe_format(exported, tmp_path):
    """An artifact whose recipe has another format_version (numerics minite no longer writes
    under that fingerprint) is refused by name, not taken for an edited manifest."""
    _, _, path = exported
    import shutil

    copy = tmp_path / "old"
    shutil.copytree(path, copy)
    manifest = json.loads((copy / "manifest.json").read_text())
    manifest["recipe"]["format_version"] = 1
    (copy / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(RolloutArtifactError, match="format_version 1.*re-export"):
        load_rollout(copy)


def test_refuses_an_older_lowering(exported, tmp_path):
    """An artifact exported by a lowering of another version (its stored graph computes, e.g.,
    cos / sin with Inductor's code rather than `fp4_compile::cos` / `sin`) is refused by name."""
    from fp4_compile.rollout.export import ARTIFACT_VERSION

    _, _, path = exported
    import shutil

    copy = tmp_path / "old_lowering"
    shutil.copytree(path, copy)
    manifest = json.loads((copy / "manifest.json").read_text())
    assert manifest["artifact_version"] == ARTIFACT_VERSION
    manifest["artifact_version"] = ARTIFACT_VERSION - 1
    (copy / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(
        RolloutArtifactError, match=f"artifact_version {ARTIFACT_VERSION - 1}.*re-export"
    ):
        load_rollout(copy)


def test_refuses_non_artifact(tmp_path):
    with pytest.raises(RolloutArtifactError, match="not a minite rollout artifact"):
        load_rollout(tmp_path)


def test_moe_artifact_equals_model_engine(tmp_path):
    """A Qwen3-MoE rollout artifact (its token gathers and SwiGLU are `gather_rows` and
    `silu_mul_halves_quantize`, the SwiGLU emitting the down GEMM's operand, in the exported
    graph, as in the learner's) decodes like the model engine."""
    from fp4_compile.models import tiny_qwen3_moe

    model = tiny_qwen3_moe(layers=2).eval()
    recipe = NVFP4Recipe.strict()
    artifact = fp4_compile.export_rollout(
        model, recipe=recipe, path=tmp_path, max_batch=8, max_seq_len=48
    )
    swiglu = "fp4_compile::silu_mul_halves_quantize"
    assert {"fp4_compile::gather_rows", swiglu} <= set(artifact.census)
    prompts = [[1, 2, 3], [4, 5, 6, 7, 8], [9]]
    a = RolloutEngine(model, recipe=recipe, max_batch=8, max_seq_len=48).generate(
        prompts, max_new_tokens=8, seed=3
    )
    b = RolloutEngine(tmp_path, expected_fingerprint=recipe.fingerprint()).generate(
        prompts, max_new_tokens=8, seed=3
    )
    assert a.tokens == b.tokens
    for x, y in zip(a.logprobs, b.logprobs):
        assert_bitwise_equal(x, y, "MoE artifact vs model engine")


def test_artifact_engine_batches_continuously_as_the_model_engine(exported):
    """The artifact's step (batch a graph dimension) prefills one request into a slot view of
    a running bucket too: 5 ragged requests with their own budgets through 2 slots (refilled
    mid-flight) == the model engine's run of them as one static batch, bitwise."""
    model, _, path = exported
    prompts = [[1, 2, 3], [4, 5, 6, 7, 8], [9], [10, 11], [12, 13, 14, 15]]
    budgets = [2, 6, 1, 4, 3]
    a = RolloutEngine(model, recipe=NVFP4Recipe.strict(), max_batch=8, max_seq_len=48).generate(
        prompts, max_new_tokens=budgets, seed=3
    )
    engine = RolloutEngine(path, expected_fingerprint=NVFP4Recipe.strict().fingerprint())
    engine.max_batch = 2
    b = engine.generate(prompts, max_new_tokens=budgets, seed=3)
    assert a.tokens == b.tokens and [len(t) for t in b.tokens] == budgets
    for x, y in zip(a.logprobs, b.logprobs):
        assert_bitwise_equal(x, y, "artifact engine, continuous, vs model engine")
