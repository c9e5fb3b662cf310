"""Full weights under Hugging Face names: streamed for the rollout engine, or exported to a directory.

:func:`named_weights` yields ``(name, tensor)`` with the names of the model's Hugging Face
checkpoint (``model.layers.0.self_attn.q_proj.weight``, what vLLM's ``load_weights`` expects):
  * FSDP2 shards are gathered one tensor at a time (``DTensor.full_tensor``, a collective: every
    rank must iterate, in the same order, which the state-dict order guarantees);
  * LoRA adapters are merged: ``W + scale * B @ A`` under the base weight's name; adapter tensors
    and peft's bookkeeping copies are not yielded; a fully trained ``modules_to_save`` head (the
    critic's ``score``) is yielded under its plain name;
  * a weight tied to another (``lm_head`` tied to the embedding) is yielded once, under its first
    name, as the checkpoint stores it.
Tensors may share memory with the live parameters: consumers copy, never write.

:func:`export_hf` writes those weights as safetensors (sharded past ``max_shard_bytes``, with the
standard index file), the model's config, and every non-weight file of the source directory
(tokenizer, chat template, generation config), so ``from_pretrained`` and vLLM load it as they
would the original.

With ``toward=(BASE_DIR, W)`` every exported weight is ``base + W * (weight - base)`` instead: the
trained policy moved back toward the model it was trained from (W 1 is the policy, 0 the base), as
WiSE-FT's weight-space ensemble (Wortsman et al., 2022) and WARP's interpolation toward the
initialisation (Ramé et al., 2024) do; W above 1 carries the policy on past itself, along the same
line (ExPO's extrapolation from the SFT model through the aligned one: Zheng et al., 2024).

:func:`averaged` is the mean, weight by weight, of the module's weights at several checkpoints of one run
(the latest weights averaged, as Kaddour, 2022, and Sanyal et al., 2024, average the last checkpoints): the
values ``export_hf(values=...)`` writes in place of the module's own.
"""

from __future__ import annotations

import copy
import json
import math
import shutil
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import torch
from torch import Tensor, nn

from posttrain.engines.training.parallel import barrier, full_tensor

_ADAPTER = "default"
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".safetensors.index.json", ".bin.index.json")


def hf_model(module: nn.Module) -> nn.Module:
    """The Hugging Face ``PreTrainedModel`` inside ``module`` (unwrapping DDP and peft)."""
    module = getattr(module, "module", module)  # DDP
    get_base_model = getattr(module, "get_base_model", None)  # peft
    return get_base_model() if callable(get_base_model) else module


def _lora_delta(module: nn.Module) -> Tensor:
    from peft.tuners.lora.layer import Linear as LoraLinear

    if not isinstance(module, LoraLinear) or module.use_dora.get(_ADAPTER, False):
        raise NotImplementedError(
            f"merging LoRA into {type(module).__name__} is not supported (only plain LoRA on Linear layers); "
            "target Linear layers only (lora_target_modules='all-linear')"
        )
    lora_a = full_tensor(module.lora_A[_ADAPTER].weight.detach()).float()
    lora_b = full_tensor(module.lora_B[_ADAPTER].weight.detach()).float()
    delta = (lora_b @ lora_a) * module.scaling[_ADAPTER]
    return delta.T if module.fan_in_fan_out else delta


def _hf_name(peft_name: str) -> str | None:
    """The checkpoint name of a peft state-dict entry, or None for entries that are not yielded."""
    if ".lora_" in peft_name or ".original_module." in peft_name:
        return None
    return peft_name.replace(".base_layer.", ".").replace(f".modules_to_save.{_ADAPTER}.", ".")


def named_weights(module: nn.Module, dtype: torch.dtype | None = None) -> Iterator[tuple[str, Tensor]]:
    """Every weight of ``module`` as a full tensor under its Hugging Face name (module docstring)."""
    root = hf_model(module)
    seen: set[int] = set()
    for name, tensor in root.state_dict(keep_vars=True).items():
        if id(tensor) in seen:
            continue
        seen.add(id(tensor))
        hf_name = _hf_name(name)
        if hf_name is None:
            continue
        weight = full_tensor(tensor.detach())
        if name.endswith(".base_layer.weight"):
            delta = _lora_delta(root.get_submodule(name[: -len(".base_layer.weight")]))
            weight = (weight.float() + delta.to(weight.device)).to(weight.dtype)
        yield hf_name, weight if dtype is None else weight.to(dtype)


def _export_config(module: nn.Module, dtype: torch.dtype):
    config = copy.deepcopy(hf_model(module).config)
    config.architectures = [type(hf_model(module)).__name__]
    config.dtype = dtype
    config.use_cache = True
    return config


def _write_shards(weights: Iterator[tuple[str, Tensor]], out_dir: Path, max_shard_bytes: int) -> None:
    from safetensors.torch import save_file

    shards: list[dict[str, Tensor]] = [{}]
    sizes = [0]
    for name, tensor in weights:
        nbytes = tensor.numel() * tensor.element_size()
        if sizes[-1] and sizes[-1] + nbytes > max_shard_bytes:
            shards.append({})
            sizes.append(0)
        # A private contiguous CPU copy: safetensors refuses views and shared storage.
        shards[-1][name] = tensor.detach().to("cpu", copy=True).contiguous()
        sizes[-1] += nbytes
    if len(shards) == 1:
        save_file(shards[0], str(out_dir / "model.safetensors"), metadata={"format": "pt"})
        return
    weight_map = {}
    for index, shard in enumerate(shards, start=1):
        file_name = f"model-{index:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, str(out_dir / file_name), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(shard, file_name))
    index_json = {"metadata": {"total_size": sum(sizes)}, "weight_map": weight_map}
    (out_dir / "model.safetensors.index.json").write_text(json.dumps(index_json, indent=2))


def _copy_non_weight_files(source_dir: Path, out_dir: Path) -> None:
    for path in source_dir.iterdir():
        if path.is_file() and path.name != "config.json" and not path.name.endswith(_WEIGHT_SUFFIXES):
            shutil.copy2(path, out_dir / path.name)


def export_hf(
    module: nn.Module,
    out_dir: str | Path,
    *,
    source_dir: Path,
    write: bool,
    dtype: torch.dtype = torch.float32,
    max_shard_bytes: int = 2 * 1024**3,
    toward: tuple[str | Path, float] | None = None,
    values: Iterable[tuple[str, Tensor]] | None = None,
) -> Path:
    """Write ``module`` as a plain Hugging Face directory (module docstring); returns ``out_dir``.
    ``values``: the weights to write in place of the module's own (its names; :func:`averaged`).

    Every rank must call it (gathering shards is collective); only ranks with ``write`` write files.
    """
    out_dir = Path(out_dir)
    weights = named_weights(module, dtype=dtype) if values is None else ((name, t.to(dtype)) for name, t in values)
    if toward is not None:  # checked before anything is written or removed
        weights = _moved_toward(module, weights, Path(toward[0]), toward[1])
    if not write:
        for _ in weights:  # take part in the gathers
            pass
        barrier()
        return out_dir
    out_dir.mkdir(parents=True, exist_ok=True)
    for stale in out_dir.glob("model*.safetensors*"):  # an earlier export's shards would shadow ours
        stale.unlink()
    _write_shards(weights, out_dir, max_shard_bytes)
    _export_config(module, dtype).save_pretrained(out_dir)
    _copy_non_weight_files(source_dir, out_dir)
    barrier()
    return out_dir


def averaged(module: nn.Module, checkpoints: list[Path], load: Callable[[Path], None],
             keep: bool = True) -> list[tuple[str, Tensor]] | None:
    """The mean of ``module``'s weights (float32, on the CPU, under their Hugging Face names, LoRA merged
    first) over ``checkpoints``, each put into the module by ``load`` in turn; the module is left at the
    last one. Every rank must call it (the gathers are collective); only with ``keep`` (the rank that
    writes) are the sums held, and returned; otherwise None."""
    if not checkpoints:
        raise ValueError("averaged: no checkpoints given")
    total: dict[str, Tensor] = {}
    for directory in checkpoints:
        load(directory)
        for name, tensor in named_weights(module):
            if keep:
                tensor = tensor.to("cpu", torch.float32, copy=True)
                total[name] = total[name].add_(tensor) if name in total else tensor
    return [(name, tensor.div_(len(checkpoints))) for name, tensor in total.items()] if keep else None


def check_weight(weight: float, name: str = "weight") -> None:
    """``toward``'s weight (called ``name`` in the message): finite, 0 (the base) or above (ValueError otherwise)."""
    if not (math.isfinite(weight) and weight >= 0.0):
        raise ValueError(f"{name} {weight}: give a finite number, 0 or above: 0 is the model trained from, 1 the trained "
                         "policy, above 1 carries the policy on past itself (ExPO)")


def _moved_toward(module: nn.Module, weights: Iterator[tuple[str, Tensor]], base_dir: Path,
                  weight: float) -> Iterator[tuple[str, Tensor]]:
    """``weights`` each moved to ``base + weight * (w - base)`` (module docstring), ``base`` read one tensor
    at a time from the Hugging Face directory ``base_dir``; refused (ValueError) unless it holds the same
    weights in the same shapes, which is checked here, before the first is yielded."""
    check_weight(weight)
    files = _tensor_files(base_dir)
    shapes = {name: tuple(tensor.shape) for name, tensor in named_weights(module)}  # every rank: the same gathers
    tied = bool(getattr(hf_model(module).config, "tie_word_embeddings", False))  # a base may store the tied head twice
    missing, extra = sorted(shapes.keys() - files.keys()), sorted(files.keys() - shapes.keys() - ({"lm_head.weight"} if tied else set()))
    if missing or extra:
        raise ValueError(f"{base_dir} holds other weights than the policy (not there: {missing[:3]}; only there: {extra[:3]}): "
                         "give the model the run was trained from")
    base_shapes = _stored_shapes({name: files[name] for name in shapes})
    for name, shape in shapes.items():
        if base_shapes[name] != shape:
            raise ValueError(f"{name}: shape {base_shapes[name]} in {base_dir}, {shape} in the policy: give the model the run was trained from")
    return ((name, torch.lerp(_read_tensor(files[name], name).float(), tensor.float(), weight).to(tensor.dtype))  # exact at 0 and 1
            for name, tensor in weights)


def _tensor_files(directory: Path) -> dict[str, Path]:
    """Weight name → the safetensors file of a Hugging Face directory (one file, or shards and their index)."""
    index = directory / "model.safetensors.index.json"
    if index.is_file():
        return {name: directory / file for name, file in json.loads(index.read_text())["weight_map"].items()}
    single = directory / "model.safetensors"
    if not single.is_file():
        raise ValueError(f"{directory} holds no model.safetensors (nor an index of shards): give a Hugging Face model directory")
    from safetensors import safe_open

    with safe_open(str(single), framework="pt") as handle:
        return dict.fromkeys(handle.keys(), single)


def _stored_shapes(files: dict[str, Path]) -> dict[str, tuple[int, ...]]:
    """The shapes of the named tensors, read from their files' headers."""
    from safetensors import safe_open

    shapes: dict[str, tuple[int, ...]] = {}
    for path in set(files.values()):
        with safe_open(str(path), framework="pt") as handle:
            shapes.update({name: tuple(handle.get_slice(name).get_shape()) for name, file in files.items() if file == path})
    return shapes


def _read_tensor(path: Path, name: str) -> Tensor:
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as handle:
        return handle.get_tensor(name)
