"""No silent eager fallback. When Dynamo hits its recompile limit for a code object (8 by
default; every new model instance of the same class is a new cache entry) it runs the frame
EAGERLY, i.e. with stock kernels and no NVFP4, without an error. Inside minite's own calls
(engine steps, learner forwards) that is turned into an error, and the limit is raised so that
a process may hold several engines and learners."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

RECOMPILE_LIMIT = 64


@contextlib.contextmanager
def no_silent_eager_fallback() -> Iterator[None]:
    # lazy: Dynamo costs about a second at `import fp4_compile`
    import torch._dynamo.config as dynamo_config

    patches = {}
    if hasattr(dynamo_config, "fail_on_recompile_limit_hit"):
        patches["fail_on_recompile_limit_hit"] = True
    for name in ("recompile_limit", "cache_size_limit"):
        if hasattr(dynamo_config, name):
            patches[name] = max(RECOMPILE_LIMIT, getattr(dynamo_config, name))
            break
    with dynamo_config.patch(patches):
        yield
