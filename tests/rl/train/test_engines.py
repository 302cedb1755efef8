"""The rollout engines' table (`rl/train/engines.py`). Contracts, exact: the table lists the
engines the settings, the trainer and `minite train --help` accept (no other list of names);
the trainer builds its engine through the table (a spy engine registered in it is the one the
trainer runs); and one GRPO step issues ONE `generate` over the whole rollout batch (prompts x
group size), also when that batch is larger than the engine's max_batch."""

import pytest

from fp4_compile.engine_api import RolloutEngineProtocol
from fp4_compile.rl.cli.train import add_train_parser
from fp4_compile.rl.train import engines as engines_mod
from fp4_compile.rl.train.engines import ENGINES, EngineEntry, build_engine, engines_help
from fp4_compile.rl.train.presets import get_preset
from fp4_compile.rl.train.trainer import GRPOTrainer
from fp4_compile.rollout import RolloutEngine


def _cfg(tmp_path, **over):
    base = dict(
        steps=1,
        prompts_per_step=3,
        group_size=4,
        warm_start_steps=0,
        eval_every=0,
        compile=False,
        out_dir=str(tmp_path / "run"),
        cache_dir=str(tmp_path / "cache"),
    )
    return get_preset("tiny").with_overrides([f"{k}={v}" for k, v in {**base, **over}.items()])


class SpyEngine:
    """The embedded engine (eager), recording each generate call's number of requests."""

    def __init__(self, req):
        self.inner = RolloutEngine(
            req.model, max_batch=req.max_batch, max_seq_len=req.max_seq_len, compile=False
        )
        self.max_batch, self.max_seq_len = req.max_batch, req.max_seq_len
        self.calls: list[int] = []
        self.updates = 0

    def generate(self, prompts, **kw):
        self.calls.append(len(prompts))
        return self.inner.generate(prompts, **kw)

    def update_weights(self, model):
        self.updates += 1
        self.inner.update_weights(model)


@pytest.fixture
def spy(monkeypatch):
    monkeypatch.setitem(ENGINES, "spy", EngineEntry(SpyEngine, "a test's spy"))
    return "spy"


def test_the_table_lists_the_engines():
    assert set(ENGINES) == {"minite", "vllm", "vllm_full", "vllm_linears", "stock"}
    text = engines_help()
    assert all(f"{name}:" in text for name in ENGINES)
    import argparse

    sub = argparse.ArgumentParser().add_subparsers()
    assert add_train_parser(sub).epilog == text


def test_settings_take_exactly_the_tables_names(tmp_path, spy):
    with pytest.raises(ValueError, match=r"rollout_engine must be one of \('minite', .*'spy'\)"):
        _cfg(tmp_path, rollout_engine="sglang")
    assert _cfg(tmp_path, rollout_engine=spy).rollout_engine == spy
    with pytest.raises(ValueError, match="rollout_cuda_graphs=True is for the embedded engine"):
        _cfg(tmp_path, rollout_engine="stock", rollout_cuda_graphs=True)


def test_build_engine_refuses_what_the_row_says(tmp_path):
    with pytest.raises(ValueError, match="rollout_engine must be one of"):
        build_engine("nope", None)
    with pytest.raises(ValueError, match=r"rollout_engine='stock' runs in one process"):
        build_engine("stock", None, world=2)


def test_the_trainer_builds_its_engine_through_the_table(tmp_path, spy, monkeypatch):
    built = []

    def record(name, req, *, world=1):
        built.append(name)
        return engines_mod.build_engine(name, req, world=world)

    import fp4_compile.rl.train.trainer as trainer_mod

    monkeypatch.setattr(trainer_mod, "build_engine", record)
    trainer = GRPOTrainer(_cfg(tmp_path, rollout_engine=spy), log=lambda *_: None)
    assert built == [spy] and isinstance(trainer.engine, SpyEngine)
    assert isinstance(trainer.engine, RolloutEngineProtocol)
    assert trainer.engine.max_batch == trainer.num_local == 12  # 0: the whole rollout batch


def test_one_generate_per_rollout_batch_larger_than_max_batch(tmp_path, spy):
    trainer = GRPOTrainer(
        _cfg(tmp_path, rollout_engine=spy, rollout_max_batch=5), log=lambda *_: None
    )
    assert trainer.engine.max_batch == 5
    record = trainer.train_step()
    assert trainer.engine.calls == [12], "one generate over prompts x group size (3 x 4)"
    assert trainer.engine.updates == 1
    assert record["rollout/mean_new_tokens"] > 0


def test_rollout_weights_reach_the_engine(tmp_path, monkeypatch):
    seen = []

    def record(name, req, *, world=1):
        seen.append(req.weights)
        return SpyEngine(req)

    import fp4_compile.rl.train.trainer as trainer_mod

    monkeypatch.setattr(trainer_mod, "build_engine", record)
    GRPOTrainer(_cfg(tmp_path, compile=True, rollout_weights="packed"), log=lambda *_: None)
    GRPOTrainer(_cfg(tmp_path / "b"), log=lambda *_: None)
    assert seen == ["packed", "bf16+packed"]


@pytest.mark.parametrize(
    "over, named",
    [
        (dict(rollout_weights="fp4"), "rollout_weights must be one of"),
        (dict(rollout_weights="packed", rollout_engine="stock"), "rollout_engine='minite'"),
        (dict(rollout_weights="packed", compile=False), "compile=True"),
        (dict(rollout_weights="packed", compile=True, variant="bf16"), "variant='bf16'"),
    ],
)
def test_rollout_weights_refused_before_any_work(tmp_path, over, named):
    with pytest.raises(ValueError, match=named):
        _cfg(tmp_path, **over)


def test_rollout_weights_do_not_block_a_resume(tmp_path):
    a = _cfg(tmp_path, compile=True)
    b = _cfg(tmp_path, compile=True, rollout_weights="packed")
    assert a.numerics_dict() == b.numerics_dict()


def test_paged_kv_cache_trains_the_same_as_static(tmp_path):
    """rollout_kv_tokens > 0: the embedded engine runs a paged cache of that many tokens; a
    pool of one page, where 4 slots take turns, gives the same rollouts and the same step."""
    records = []
    # 4 requests of width 13 at once, one 64-token page: they take turns
    for name, over in (("static", {}), ("paged", dict(rollout_kv_tokens=64))):
        trainer = GRPOTrainer(
            _cfg(tmp_path / name, rollout_max_batch=4, **over), log=lambda *_: None
        )
        if name == "paged":  # page 0 is the scratch page
            assert (trainer.engine.paged.num_pages, trainer.engine.paged.page_size) == (2, 64)
        else:
            assert trainer.engine.paged is None
        records.append(trainer.train_step())
    static, paged = records
    assert paged["rollout/kv_preemptions"] == 0 and "rollout/kv_preemptions" not in static
    assert paged["mismatch/max_abs_dlogp"] == static["mismatch/max_abs_dlogp"]
    for key in ("rollout/mean_new_tokens", "reward/mean", "loss/policy"):
        assert paged[key] == static[key], key


@pytest.mark.parametrize(
    "over, named",
    [
        (dict(rollout_kv_tokens=-1), "rollout_kv_tokens must be an int >= 0"),
        (dict(rollout_kv_tokens=256, rollout_engine="stock"), "rollout_engine='minite'"),
    ],
)
def test_rollout_kv_tokens_refused_before_any_work(tmp_path, over, named):
    with pytest.raises(ValueError, match=named):
        _cfg(tmp_path, **over)
