"""Checkpoints: tensors in safetensors files, everything else in JSON; never pickle.

A training run directory holds one checkpoint, written as a set:

* ``model.safetensors`` — the weights (tied weights stored once);
* ``optimizer.safetensors`` — the optimiser's per-parameter state, its hyperparameters in the
  file's metadata;
* ``trainer_state.json`` — the step reached and the SHA-256 of both files, moved into place
  last, so a file that was truncated or corrupted is caught on load. A save interrupted between
  its moves leaves the previous weights and optimiser state beside the new ones, and
  :func:`settle_checkpoint` puts back the ones the state names;
* with ``keep_checkpoints``, ``checkpoints/step-N.safetensors`` — the weights at every
  checkpoint, kept for analyses along training.

A full disk while saving stops the run in one line (:class:`~nopelab.errors.RunFailed`) that
names the folder and the space a checkpoint needs; the previous checkpoint stays.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file, save_file
from torch import nn

from nopelab.errors import RunFailed, UserError, first_line
from nopelab.limits import size_text
from nopelab.runtime.rundir import is_disk_full, previous_version, replaced_together

MODEL_FILE = "model.safetensors"
OPTIMIZER_FILE = "optimizer.safetensors"
STATE_FILE = "trainer_state.json"
KEPT_FOLDER = "checkpoints"  # step-N.safetensors: each checkpoint's weights, if kept
OS_ERROR = re.compile(r"\(os error (\d+)\)")  # how safetensors reports a failed write


class CheckpointError(UserError):
    """A checkpoint that is missing, damaged or does not fit the model."""


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def model_tensors(model: nn.Module) -> dict[str, torch.Tensor]:
    """The state dict with every shared tensor kept once (under its first name), contiguous."""
    seen: set[int] = set()
    tensors = {}
    for name, tensor in model.state_dict().items():
        if tensor.data_ptr() in seen:
            continue
        seen.add(tensor.data_ptr())
        tensors[name] = tensor.detach().contiguous().cpu()
    return tensors


def save_model(model: nn.Module, path: Path) -> None:
    save_file(model_tensors(model), str(path))


def _read_safetensors(path: Path) -> dict[str, torch.Tensor]:
    if not path.is_file():
        raise CheckpointError(f"checkpoint: {path} is missing")
    try:
        return load_file(str(path))
    except (SafetensorError, OSError, ValueError) as exc:
        detail = first_line(exc)
        raise CheckpointError(f"checkpoint: {path} is damaged or truncated ({detail})") from None


def load_model(model: nn.Module, path: Path, expected_sha256: str | None = None) -> None:
    """Load weights into ``model``; names and shapes must match its configuration exactly."""
    if expected_sha256 is not None and path.is_file() and sha256(path) != expected_sha256:
        raise CheckpointError(
            f"checkpoint: {path} does not match the hash recorded at save time (corrupted?)"
        )
    tensors = _read_safetensors(path)
    expected = model_tensors(model)
    missing = sorted(set(expected) - set(tensors))
    unexpected = sorted(set(tensors) - set(expected))
    if missing or unexpected:
        what = f"missing {missing[0]!r}" if missing else f"unexpected {unexpected[0]!r}"
        raise CheckpointError(
            f"checkpoint: {path} does not match the model config ({what}; "
            f"{len(missing)} missing, {len(unexpected)} unexpected tensors)"
        )
    for name, tensor in tensors.items():
        if tensor.shape != expected[name].shape:
            raise CheckpointError(
                f"checkpoint: {path} does not match the model config: {name} has shape "
                f"{tuple(tensor.shape)}, the config gives {tuple(expected[name].shape)}"
            )
    with torch.no_grad():
        params = dict(model.state_dict(keep_vars=True))
        for name, tensor in tensors.items():
            params[name].copy_(tensor)


def save_optimizer(optimizer: torch.optim.Optimizer, path: Path) -> None:
    state = optimizer.state_dict()
    tensors = {
        f"{index}.{key}": value.detach().contiguous().cpu()
        for index, entries in state["state"].items()
        for key, value in entries.items()
    }
    metadata = {"param_groups": json.dumps(state["param_groups"])}
    save_file(tensors, str(path), metadata=metadata)


def load_optimizer(
    optimizer: torch.optim.Optimizer, path: Path, expected_sha256: str | None = None
) -> None:
    if expected_sha256 is not None and path.is_file() and sha256(path) != expected_sha256:
        raise CheckpointError(
            f"checkpoint: {path} does not match the hash recorded at save time (corrupted?)"
        )
    tensors = _read_safetensors(path)
    with safe_open(str(path), "pt") as f:
        groups = json.loads((f.metadata() or {}).get("param_groups", "[]"))
    for group in groups:  # JSON turned tuples (betas) into lists
        group.update(
            {k: tuple(v) for k, v in group.items() if isinstance(v, list) and k != "params"}
        )
    state: dict[int, dict[str, torch.Tensor]] = {}
    for name, tensor in tensors.items():
        index, key = name.split(".", 1)
        state.setdefault(int(index), {})[key] = tensor
    try:
        optimizer.load_state_dict({"state": state, "param_groups": groups})
    except (ValueError, KeyError) as exc:
        raise CheckpointError(f"checkpoint: {path} does not fit this optimiser ({exc})") from None


def save_checkpoint(
    out: Path, model: nn.Module, optimizer: torch.optim.Optimizer, state: dict[str, Any]
) -> None:
    """Write weights, optimiser state and ``trainer_state.json`` with both files' hashes; the
    three replace the previous checkpoint only once all are written (a full disk or an
    interrupt keeps the previous one). A full disk raises :class:`~nopelab.errors.RunFailed`."""
    paths = [out / MODEL_FILE, out / OPTIMIZER_FILE, out / STATE_FILE]
    try:
        with replaced_together(paths) as (model_tmp, optimizer_tmp, state_tmp):
            save_model(model, model_tmp)
            save_optimizer(optimizer, optimizer_tmp)
            record = {
                **state,
                "model_sha256": sha256(model_tmp),
                "optimizer_sha256": sha256(optimizer_tmp),
            }
            state_tmp.write_text(json.dumps(record, indent=2))
    except (OSError, SafetensorError) as exc:
        error = _os_error(exc)
        if error is None or not is_disk_full(error):
            raise
        raise RunFailed(
            f"{error.strerror} while writing the checkpoint into {out}: it needs about "
            f"{size_text(checkpoint_bytes(model, optimizer))}, "
            f"{size_text(shutil.disk_usage(out).free)} is free"
        ) from None


def checkpoint_bytes(model: nn.Module, optimizer: torch.optim.Optimizer) -> int:
    """The size of the tensors a checkpoint of ``model`` and ``optimizer`` holds."""
    tensors = [
        *model_tensors(model).values(),
        *(v for entries in optimizer.state_dict()["state"].values() for v in entries.values()),
    ]
    return sum(t.numel() * t.element_size() for t in tensors)


def _os_error(exc: Exception) -> OSError | None:
    """``exc`` as an ``OSError``: safetensors reports one only in its message."""
    if isinstance(exc, OSError):
        return exc
    match = OS_ERROR.search(str(exc))
    if match is None:
        return None
    code = int(match.group(1))
    return OSError(code, os.strerror(code))


def read_state(out: Path) -> dict[str, Any]:
    path = out / STATE_FILE
    if not path.is_file():
        raise CheckpointError(f"checkpoint: {out} has no {STATE_FILE}; it holds no checkpoint")
    try:
        state = json.loads(path.read_text())
    except (OSError, ValueError, UnicodeDecodeError):
        raise CheckpointError(f"checkpoint: {path} is damaged (not valid JSON)") from None
    if not isinstance(state, dict) or not isinstance(state.get("step"), int):
        raise CheckpointError(f"checkpoint: {path} has no step count")
    return state


def settle_checkpoint(out: Path) -> bool:
    """Make the checkpoint in ``out`` whole after a save that was interrupted between its moves
    (new weights beside the old ``trainer_state.json``): each file the state's hash does not
    match is replaced by its kept previous version when that one matches. Returns whether a
    file was put back; kept versions no longer needed are removed."""
    state = read_state(out)
    restored = False
    for name, key in ((MODEL_FILE, "model_sha256"), (OPTIMIZER_FILE, "optimizer_sha256")):
        path, previous = out / name, previous_version(out / name)
        if not previous.is_file():
            continue
        expected = state.get(key)
        stale = not path.is_file() or sha256(path) != expected
        if stale and sha256(previous) == expected:
            os.replace(previous, path)
            restored = True
        else:
            previous.unlink()
    return restored


def load_checkpoint(
    out: Path, model: nn.Module, optimizer: torch.optim.Optimizer | None = None
) -> dict[str, Any]:
    """Restore ``model`` (and ``optimizer``) from ``out``; returns the trainer state."""
    state = read_state(out)
    load_model(model, out / MODEL_FILE, state.get("model_sha256"))
    if optimizer is not None:
        load_optimizer(optimizer, out / OPTIMIZER_FILE, state.get("optimizer_sha256"))
    return state
