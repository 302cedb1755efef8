"""`export_rollout` / `load_rollout`: the rollout graph from the SAME lowering as the learner.

The rollout step (prefill and decode are one step with dynamic batch B and token count Tq, see
`fp4_compile.rollout.step`) is captured with `torch.export`, put through the same pass
pipeline and recipe as `torch.compile(backend="minite")`, and saved with:

- `rollout.pt2`: the lowered ExportedProgram (or, with aot=True, an AOTInductor package),
- `weights.safetensors`: the master weights, and the learner's quantized bytes of every NVFP4
  weight (codes, block scales, global scales) under `<name>.nvfp4.*`,
- `manifest.json`: recipe (dict + fingerprint), the op census of the graph, package versions,
  GPU architecture, the model config, and a sha256 per file.

`load_rollout(path, expected_fingerprint=...)` checks every checksum, the fingerprint and the
architecture, and refuses (RolloutArtifactError) anything that does not match.
"""

from __future__ import annotations

import hashlib
import json
import platform
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import save_file

from .. import codegen  # noqa: F401  (registers the fp4_compile ops a loaded program calls)
from ..codegen.nvfp4.api import quantize_weight_bytes
from ..compiler_pins import aoti_inductor_configs, pinned_matmul_precision
from ..passes import quantized_weight_inputs, run_pipeline
from ..recipe import FORMAT_VERSION, NVFP4Recipe, as_recipe
from ..version import __version__
from .step import RolloutStep

MANIFEST = "manifest.json"
PROGRAM = "rollout.pt2"
WEIGHTS = "weights.safetensors"
# The lowered program's own version: bump it when the lowering changes what an exported program
# computes (an op that takes over or gives back part of the graph's numerics); an artifact of
# another version is refused, since its stored graph is the old lowering's.
ARTIFACT_VERSION = 5


class RolloutArtifactError(ValueError):
    """A rollout artifact that is corrupt, foreign, or made for other numerics/hardware."""


def device_arch(device: torch.device | str) -> str:
    device = torch.device(device)
    if device.type == "cuda":
        major, minor = torch.cuda.get_device_capability(device)
        return f"sm_{major}{minor}"
    return f"cpu-{platform.machine()}"


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _versions() -> dict[str, str]:
    out = {"torch": torch.__version__, "python": platform.python_version()}
    for name in ("triton", "transformers"):
        try:
            out[name] = __import__(name).__version__
        except ImportError:
            out[name] = "absent"
    out["minite"] = __version__
    return out


@dataclass
class RolloutArtifact:
    """What `export_rollout` returns and `load_rollout` gives back."""

    program: torch.export.ExportedProgram | None
    manifest: dict
    path: Path | None
    model_config: dict

    @property
    def recipe(self) -> NVFP4Recipe:
        return NVFP4Recipe.from_dict(self.manifest["recipe"])

    @property
    def census(self) -> list[str]:
        return self.manifest["census"]

    def module(self) -> torch.nn.Module:
        if self.program is None:
            raise RolloutArtifactError(
                "this artifact holds an AOTInductor package; load it with load_rollout"
            )
        return self.program.module()


def _example_inputs(model, *, batch: int, tokens: int, max_seq_len: int, device):
    cfg = getattr(model.config, "text_config", None) or model.config
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    dtype = next(model.parameters()).dtype
    ids = torch.zeros((batch, tokens), dtype=torch.long, device=device)
    pos = torch.arange(tokens, device=device).expand(batch, tokens).contiguous()
    kv_len = torch.full((batch,), tokens, dtype=torch.long, device=device)
    caches = []
    for _ in range(cfg.num_hidden_layers):
        for _ in range(2):
            caches.append(
                torch.zeros(
                    (batch, cfg.num_key_value_heads, max_seq_len, head_dim),
                    dtype=dtype,
                    device=device,
                )
            )
    return (ids, pos, kv_len, *caches)


def _quantized_weights(program, recipe: NVFP4Recipe) -> dict[str, torch.Tensor]:
    """The learner's quantized bytes of every weight the lowering quantizes (same quantizer)."""
    state = program.state_dict
    out = {}
    for name, experts, group in quantized_weight_inputs(program):
        members = [state[m] for m in group]
        codes, scales, gd = quantize_weight_bytes(
            state[name], recipe, experts=experts, group=members
        )
        out[f"{name}.nvfp4.codes"] = codes.cpu().contiguous()
        out[f"{name}.nvfp4.block_scales"] = scales.cpu().contiguous().view(torch.uint8)
        out[f"{name}.nvfp4.global_decode"] = gd.cpu().contiguous()
    return out


def _resync_output_names(program) -> None:
    """The passes replace nodes (the lm_head linear is an output); point the program's output
    specs at the nodes that now produce those outputs (the specs are positional)."""
    out_node = next(n for n in program.graph_module.graph.nodes if n.op == "output")
    for spec, arg in zip(program.graph_signature.output_specs, out_node.args[0]):
        if isinstance(arg, torch.fx.Node) and hasattr(spec.arg, "name"):
            spec.arg.name = arg.name


def export_rollout(
    model,
    *,
    recipe: NVFP4Recipe | dict | None = None,
    path: str | Path | None = None,
    max_batch: int = 64,
    max_seq_len: int = 512,
    aot: bool = False,
) -> RolloutArtifact:
    """Export the rollout step of a transformers causal LM through minite's lowering."""
    recipe = as_recipe(recipe)
    if path is not None:
        _check_destination(Path(path))
    model = getattr(model, "_orig_mod", model)
    device = next(model.parameters()).device
    step = RolloutStep(model).eval()
    example = _example_inputs(model, batch=2, tokens=4, max_seq_len=max_seq_len, device=device)
    batch = torch.export.Dim("batch", min=1, max=max_batch)
    tokens = torch.export.Dim("tokens", min=1, max=max_seq_len)
    caches = tuple({0: batch} for _ in example[3:])
    dynamic = ({0: batch, 1: tokens}, {0: batch, 1: tokens}, {0: batch}, caches)
    with torch.no_grad():
        program = torch.export.export(step, example, dynamic_shapes=dynamic, strict=False)
    with torch.no_grad():  # an inference graph: no pass prepares operands for a backward
        report = run_pipeline(program.graph_module, recipe)
    _resync_output_names(program)
    manifest = {
        "artifact_version": ARTIFACT_VERSION,
        "recipe": recipe.to_dict(),
        "fingerprint": recipe.fingerprint(),
        "census": report.census,
        "lowering": [g.__dict__ for g in report.gemms],
        "versions": _versions(),
        "arch": device_arch(device),
        "max_batch": max_batch,
        "max_seq_len": max_seq_len,
        "aot": bool(aot),
        "files": {},
    }
    model_config = model.config.to_dict()
    artifact = RolloutArtifact(
        program=program, manifest=manifest, path=None, model_config=model_config
    )
    if path is not None:
        artifact.path = _save(artifact, Path(path), recipe, aot=aot)
    return artifact


def _check_destination(folder: Path) -> None:
    """An artifact is written into a new or empty folder, or over an earlier minite artifact;
    never into a folder holding anything else (its files would be mixed with ours)."""
    if folder.exists() and not folder.is_dir():
        raise ValueError(f"path {str(folder)!r} exists and is not a folder")
    if not folder.is_dir() or not any(folder.iterdir()):
        return
    try:
        ours = "artifact_version" in json.loads((folder / MANIFEST).read_text())
    except (OSError, ValueError):
        ours = False
    if not ours:
        raise ValueError(
            f"path {str(folder)!r} is a non-empty folder that holds no minite rollout artifact; "
            "choose a new or empty folder"
        )


def _save(artifact: RolloutArtifact, folder: Path, recipe: NVFP4Recipe, *, aot: bool) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    program = artifact.program
    tensors = {k: v.detach().cpu().contiguous() for k, v in program.state_dict.items()}
    tensors.update(_quantized_weights(program, recipe))
    save_file(tensors, str(folder / WEIGHTS))
    if aot:
        from torch._inductor import aoti_compile_and_package  # lazy: Inductor costs seconds

        with pinned_matmul_precision():
            aoti_compile_and_package(
                program,
                package_path=str(folder / PROGRAM),
                inductor_configs=aoti_inductor_configs(),
            )
    else:
        torch.export.save(program, str(folder / PROGRAM))
    (folder / "model_config.json").write_text(
        json.dumps(artifact.model_config, sort_keys=True, default=str)
    )
    files = {name: _sha256(folder / name) for name in (PROGRAM, WEIGHTS, "model_config.json")}
    artifact.manifest["files"] = files
    (folder / MANIFEST).write_text(
        json.dumps(artifact.manifest, indent=1, sort_keys=True, default=str)
    )
    return folder


def load_rollout(
    path: str | Path, *, expected_fingerprint: str | None = None, device=None, strict: bool = True
) -> RolloutArtifact:
    """Load and verify an exported rollout. Refuses a missing/corrupt file, a fingerprint other
    than `expected_fingerprint` (strict), or an artifact exported for another architecture."""
    folder = Path(path)
    manifest_path = folder / MANIFEST
    if not manifest_path.is_file():
        raise RolloutArtifactError(f"{folder} has no {MANIFEST}: not a minite rollout artifact")
    try:
        manifest = json.loads(manifest_path.read_text())
    except json.JSONDecodeError as e:
        raise RolloutArtifactError(f"{manifest_path} is not valid JSON: {e}") from None
    if manifest.get("artifact_version") != ARTIFACT_VERSION:
        raise RolloutArtifactError(
            f"artifact_version {manifest.get('artifact_version')}: this minite lowers rollouts as "
            f"version {ARTIFACT_VERSION} (the stored graph's numerics differ): re-export the rollout"
        )
    for name, digest in manifest.get("files", {}).items():
        file = folder / name
        if not file.is_file():
            raise RolloutArtifactError(f"{file} is missing")
        if _sha256(file) != digest:
            raise RolloutArtifactError(f"{file} is corrupt: sha256 differs from the manifest")
    version = manifest["recipe"].get("format_version")
    if version != FORMAT_VERSION:
        raise RolloutArtifactError(
            f"the artifact's recipe has format_version {version}, this minite writes "
            f"{FORMAT_VERSION} (its numerics changed): re-export the rollout"
        )
    recipe = NVFP4Recipe.from_dict(manifest["recipe"])
    if recipe.fingerprint() != manifest["fingerprint"]:
        raise RolloutArtifactError(
            "manifest recipe and fingerprint disagree: the manifest was edited"
        )
    if (
        strict
        and expected_fingerprint is not None
        and expected_fingerprint != manifest["fingerprint"]
    ):
        raise RolloutArtifactError(
            f"rollout numerics {manifest['fingerprint']} differ from the learner's {expected_fingerprint}: "
            "refusing to run (strict). Re-export with the learner's recipe."
        )
    here = device_arch(
        device if device is not None else ("cuda" if torch.cuda.is_available() else "cpu")
    )
    if manifest["arch"] != here:
        raise RolloutArtifactError(
            f"artifact was exported for {manifest['arch']}, this device is {here}: its kernels (and bits) differ"
        )
    program = None
    if not manifest.get("aot"):
        program = torch.export.load(str(folder / PROGRAM))
    model_config = json.loads((folder / "model_config.json").read_text())
    return RolloutArtifact(
        program=program, manifest=manifest, path=folder, model_config=model_config
    )
