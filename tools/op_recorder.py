"""Record every `fp4_compile::` op call of a run (inputs, outputs, layouts), and compare two runs
op by op: where two executions of the same lowered model (compiled vs the lowered graph run
eagerly, or two machines) first disagree.

Opaque ops see the same inputs in both runs unless a TRACED op upstream (one Inductor generates
or fuses) computed them differently; an op whose inputs agree bitwise but whose outputs differ is
itself the place (its kernels depend on something other than the values: strides, storage
offsets, pointer alignment; the recorder notes those too). A `TorchDispatchMode` sees the calls
of eager autograd and of Inductor's compiled code alike (both go through the dispatcher).

    loss_a = eager_lowered(ids).sum(); loss_b = compiled(ids).sum()   # forward outside:
    with OpRecorder() as a: loss_a.backward()                         # Dynamo does not trace
    with OpRecorder() as b: loss_b.backward()                         # under a dispatch mode
    for row in compare_runs(a.calls, b.calls): ...
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

import torch
from torch.utils._python_dispatch import TorchDispatchMode


def _digest(t: torch.Tensor) -> str:
    data = t.detach().contiguous().cpu().reshape(-1)
    raw = data.to(torch.uint8) if data.dtype == torch.bool else data.view(torch.uint8)
    return hashlib.sha1(raw.numpy().tobytes()).hexdigest()[:16]


def _layout(t: torch.Tensor) -> str:
    """shape / strides + storage offset, and whether the data pointer is 16-byte aligned (what
    vectorized loads and GEMM libraries' kernel choices follow; the address itself varies)."""
    aligned = "a16" if t.data_ptr() % 16 == 0 else f"a{t.data_ptr() % 16}"
    return f"{tuple(t.shape)}/{t.stride()}+{t.storage_offset()}/{aligned}"


def _flatten(value) -> list:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _flatten(v)]
    return []


@dataclass
class OpCall:
    op: str
    key: str
    """op name + input shapes + non-tensor arguments: what pairs a call with its twin."""
    inputs: list[str]
    outputs: list[str]
    layouts: list[str] = field(default_factory=list)


class OpRecorder(TorchDispatchMode):
    def __init__(self, namespace: str = "fp4_compile"):
        super().__init__()
        self.namespace = namespace
        self.calls: list[OpCall] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        name = str(func)
        if name.startswith(self.namespace + "."):
            tensors = _flatten(list(args) + list(kwargs.values()))
            scalars = [a for a in args if not isinstance(a, (torch.Tensor, list, tuple))]
            shapes = [tuple(t.shape) for t in tensors]
            self.calls.append(
                OpCall(
                    op=name,
                    key=f"{name} {shapes} {scalars}",
                    inputs=[_digest(t) for t in tensors],
                    outputs=[_digest(t) for t in _flatten(out)],
                    layouts=[_layout(t) for t in tensors],
                )
            )
        return out


def compare_runs(a: list[OpCall], b: list[OpCall]) -> list[dict]:
    """Pair the calls of two runs by key (in call order within a key) and say, per pair, whether
    the inputs and the outputs agree bitwise and whether the layouts do. Order: run a's."""
    pending: dict[str, list[OpCall]] = {}
    for call in b:
        pending.setdefault(call.key, []).append(call)
    rows = []
    for call in a:
        twins = pending.get(call.key)
        twin = twins.pop(0) if twins else None
        if twin is None:
            rows.append({"op": call.op, "key": call.key, "paired": False})
            continue
        rows.append(
            {
                "op": call.op,
                "key": call.key,
                "paired": True,
                "inputs_equal": call.inputs == twin.inputs,
                "differing_inputs": [
                    i for i, (x, y) in enumerate(zip(call.inputs, twin.inputs)) if x != y
                ],
                "outputs_equal": call.outputs == twin.outputs,
                "layouts_equal": call.layouts == twin.layouts,
                "layouts": (call.layouts, twin.layouts) if call.layouts != twin.layouts else None,
            }
        )
    for key, left in pending.items():
        rows.extend({"op": c.op, "key": key, "paired": False, "only_in": "b"} for c in left)
    return rows


def first_culprit(rows: list[dict]) -> dict | None:
    """The first paired call whose inputs agree and whose outputs do not, or None."""
    return next(
        (r for r in rows if r.get("paired") and r["inputs_equal"] and not r["outputs_equal"]), None
    )
