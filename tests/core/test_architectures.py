"""The support table, tested: every architecture family of `fp4_compile.models.ARCHITECTURES`
(tiny random configs) trains through `backend="minite"` (forward and backward, finite gradients on
every parameter) and its engine's log-probs equal the learner's, bitwise (strict recipe). A family
that is not supported is refused with a LoweringError that names the reason; README's support
table lists the same families and outcomes."""

import pytest
import torch

from fp4_compile import NVFP4Recipe
from fp4_compile.models import ARCHITECTURES, tiny_causal_lm
from fp4_compile.passes import LoweringError
from fp4_compile.rollout import RolloutEngine, sequence_logprobs
from fp4_compile.testing import assert_bitwise_equal

# family -> the error it is refused with (None: fully supported)
REFUSED = {"gemma2": r"attn_implementation='eager'"}

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("arch", sorted(ARCHITECTURES))
def test_family_trains_and_rollout_equals_learner(arch):
    # each family compiled as a user's process would: alone (after gemma, Dynamo would trace
    # gemma3's softmax scale as a symbolic float, which lower_attention refuses by name)
    torch._dynamo.reset()
    torch.manual_seed(0)
    recipe = NVFP4Recipe.strict()
    model = tiny_causal_lm(arch, layers=1)
    ids = torch.randint(0, model.config.vocab_size, (2, 12))
    learner = torch.compile(model, backend="minite", options={"recipe": recipe})
    if arch in REFUSED:
        with pytest.raises(Exception, match=REFUSED[arch]) as caught:
            learner(input_ids=ids, use_cache=False)
        assert isinstance(caught.value, LoweringError) or isinstance(
            getattr(caught.value, "inner_exception", None), LoweringError
        )
        return
    learner(input_ids=ids, use_cache=False).logits.float().pow(2).mean().backward()
    no_grad = [n for n, p in model.named_parameters() if p.requires_grad and p.grad is None]
    assert not no_grad, f"no gradient for {no_grad[:4]}"
    bad = [
        n for n, p in model.named_parameters() if p.grad is not None and not p.grad.isfinite().all()
    ]
    assert not bad, f"non-finite gradients in {bad[:4]}"

    model.eval().zero_grad(set_to_none=True)
    engine = RolloutEngine(model, recipe=recipe, max_batch=4, max_seq_len=32)
    prompts = [[3, 5, 7, 9], [11, 2]]
    out = engine.generate(prompts, max_new_tokens=6, seed=0)
    with torch.no_grad():
        ref = sequence_logprobs(
            learner, [p + t for p, t in zip(prompts, out.tokens)], [len(p) for p in prompts]
        )
    for i, (a, b) in enumerate(zip(out.logprobs, ref)):
        assert_bitwise_equal(a, b, f"{arch} request {i}")
