"""Until the pass pipeline lands, the backend refuses clearly (it must not pretend to compile)."""

import pytest
import torch


def test_minite_backend_refuses_clearly():
    model = torch.nn.Linear(16, 16)
    compiled = torch.compile(model, backend="minite")
    with pytest.raises(Exception, match="not implemented yet"):
        compiled(torch.randn(2, 16))
