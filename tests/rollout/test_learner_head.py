"""The learner's row-chunked head (`fp4_compile/rollout/learner_head.py`), bitwise: through a
minite-compiled model, `sequence_logprobs` gives the same log-probs at every chunk size, equal to
the full-logits path (chunk_rows=None), and the same gradient of every parameter at every chunk
size (chunks that divide the row count and chunks that do not). A recipe that quantizes the head
is refused by name."""

import pytest
import torch

from fp4_compile import NVFP4Recipe, sr_stream
from fp4_compile.models import tiny_qwen3
from fp4_compile.rollout import sequence_logprobs
from fp4_compile.rollout.learner_head import chunked_head_parts, minite_options
from fp4_compile.testing import assert_bitwise_equal


def _sequences(vocab, seed=0):
    g = torch.Generator().manual_seed(seed)
    lengths = [200, 131, 250]  # 575 tokens; the targets' rows: 575 - 3 prompts
    seqs = [torch.randint(0, vocab, (n,), generator=g).tolist() for n in lengths]
    return seqs, [5, 1, 17]


@pytest.fixture(scope="module")
def learner():
    model = tiny_qwen3(vocab=384, layers=1).eval()
    return model, torch.compile(model, backend="minite", options={"recipe": NVFP4Recipe.strict()})


def _logp_and_grads(model, learner, chunk):
    seqs, prompt_lens = _sequences(model.config.vocab_size)
    model.zero_grad(set_to_none=True)
    sr_stream.set_sr_state(None)  # the same gradient rounding noise in every run
    out = sequence_logprobs(learner, seqs, prompt_lens, temperature=0.8, chunk_rows=chunk)
    torch.cat(out).mul(torch.linspace(-1, 1, sum(len(o) for o in out))).sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    return [o.detach() for o in out], grads


def test_chunk_sizes_bitwise_forward_and_gradients(learner):
    model, compiled = learner
    assert minite_options(compiled)["recipe"] == NVFP4Recipe.strict()
    assert chunked_head_parts(compiled) is not None
    ref_logp, ref_grads = _logp_and_grads(model, compiled, 1024)  # one chunk
    for chunk in (256, 512):  # 569 rows: neither divides it
        logp, grads = _logp_and_grads(model, compiled, chunk)
        for i, (a, b) in enumerate(zip(logp, ref_logp)):
            assert_bitwise_equal(a, b, f"sequence {i} log-probs at chunk {chunk}")
        for name in ref_grads:
            assert_bitwise_equal(grads[name], ref_grads[name], f"grad {name} at chunk {chunk}")


def test_equals_full_logits_path(learner):
    model, compiled = learner
    seqs, prompt_lens = _sequences(model.config.vocab_size, seed=1)
    with torch.no_grad():
        full = sequence_logprobs(compiled, seqs, prompt_lens, temperature=0.8, chunk_rows=None)
        chunked = sequence_logprobs(compiled, seqs, prompt_lens, temperature=0.8, chunk_rows=256)
    for i, (a, b) in enumerate(zip(chunked, full)):
        assert_bitwise_equal(a, b, f"sequence {i}: chunked vs full logits")


def test_eager_model_keeps_its_full_forward():
    model = tiny_qwen3(vocab=128, layers=1).eval()
    assert chunked_head_parts(model) is None
    assert minite_options(torch.compile(model, backend="eager")) is None


def test_quantized_head_refused_by_name():
    model = tiny_qwen3(vocab=128, layers=1).eval()
    recipe = NVFP4Recipe.strict().with_(bf16_modules=("*embed_tokens*",))
    compiled = torch.compile(model, backend="minite", options={"recipe": recipe})
    with pytest.raises(ValueError, match="lm_head"):
        chunked_head_parts(compiled)


def test_a_learner_batch_that_cannot_fit_is_refused_naming_its_shape():
    """Contract: before the forward, a batch beyond the floor of what it must hold (saved layer
    inputs, last hidden states, one head chunk) is refused with its shape and bytes."""
    from transformers import Qwen3Config

    from fp4_compile.rollout.learner_head import check_learner_fits, learner_memory_floor

    cfg = Qwen3Config(hidden_size=4096, num_hidden_layers=36, vocab_size=151936)
    ids = torch.zeros(8, 4096, dtype=torch.long)
    floor = learner_memory_floor(cfg, 8 * 4096, chunk_rows=2048, grad=True)
    assert floor["saved layer inputs"] == 36 * 8 * 4096 * 4096 * 2
    assert floor["one head chunk"] == 2048 * 151936 * 4
    need = sum(floor.values())
    check_learner_fits(cfg, ids, chunk_rows=2048, free_bytes=need)  # fits exactly: no error
    with pytest.raises(ValueError, match=r"8 x 4096 tokens needs at least .* GiB"):
        check_learner_fits(cfg, ids, chunk_rows=2048, free_bytes=need - 1)
    with torch.no_grad():  # no backward: nothing saved for it
        check_learner_fits(cfg, ids, chunk_rows=2048, free_bytes=need - floor["saved layer inputs"])
