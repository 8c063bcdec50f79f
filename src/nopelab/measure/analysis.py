"""Run a model over generated inputs and reduce the chosen sites' statistics on the fly."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import torch

from nopelab.config import AnalysisConfig, ModelConfig
from nopelab.errors import ConfigError
from nopelab.measure.capture import CaptureResult, StreamingCapture
from nopelab.models.transformer import Transformer
from nopelab.runtime.device import resolve_device
from nopelab.runtime.progress import progress as show_progress

if TYPE_CHECKING:
    from nopelab.hf.load import TextWindows
    from nopelab.hf.sites import HFModel, HFSpec
    from nopelab.training.sources import Source


def input_batches(
    model_cfg: ModelConfig | HFSpec, cfg: AnalysisConfig, source: Source | TextWindows | None = None
) -> Iterator[dict[str, torch.Tensor]]:
    """Model inputs, batch by batch: N(0, 1) vectors (Chi et al.), uniform token ids,
    held-out data of a training ``source`` (``input = "data"``), or a task source's test
    prompts, one per sequence, left-padded (``input = "prompts"``, Zuo et al.'s protocol).

    Drawn on the CPU from their own generator (seed + 1), so they do not depend on the device.
    Inputs that cannot be made are refused here, before the first batch is drawn.
    """
    if cfg.input in ("data", "prompts") and source is None:
        raise ConfigError(
            "input", f"{cfg.input} needs a trained run's data source; use random or tokens"
        )
    generator = torch.Generator().manual_seed(cfg.seed + 1)
    prompts = None
    if cfg.input == "prompts":
        from nopelab.training.sources import TaskSource

        if not isinstance(source, TaskSource):
            raise ConfigError("input", "prompts needs a run trained on a task; use data")
        prompts = source.prompts(cfg.samples, cfg.seq_len, generator)
    return _batches(model_cfg, cfg, source, generator, prompts)


def _batches(
    model_cfg: ModelConfig | HFSpec,
    cfg: AnalysisConfig,
    source: Source | TextWindows | None,
    generator: torch.Generator,
    prompts: torch.Tensor | None,
) -> Iterator[dict[str, torch.Tensor]]:
    for start in range(0, cfg.samples, cfg.batch_size):
        B = min(cfg.batch_size, cfg.samples - start)
        if prompts is not None:
            yield {"idx": prompts[start : start + B]}
        elif cfg.input == "data":
            assert source is not None  # checked by input_batches
            yield {"idx": source.held_out(B, cfg.seq_len, generator)}
        elif cfg.input == "random":
            yield {
                "inputs_embeds": torch.randn(B, cfg.seq_len, model_cfg.d_model, generator=generator)
            }
        else:
            yield {
                "idx": torch.randint(model_cfg.vocab_size, (B, cfg.seq_len), generator=generator)
            }


@torch.inference_mode()
def analyze_model(
    model: Transformer | HFModel,
    cfg: AnalysisConfig,
    description: str = "analyze",
    progress: bool = True,
    source: Source | TextWindows | None = None,
) -> CaptureResult:
    """Feed ``cfg.samples`` sequences through ``model`` and return the reduced stats.

    ``source``: a training run's data, for ``cfg.input == "data"``.
    """
    device = resolve_device(cfg.device)
    dtype = getattr(torch, cfg.dtype)
    model = model.to(device=device, dtype=dtype).eval()
    batches = input_batches(model.cfg, cfg, source)
    capture = StreamingCapture(model, cfg.sites, cfg.seq_len, device)
    line = f"{description}: analysing {cfg.samples} samples at T={cfg.seq_len}"
    with capture, show_progress(line, cfg.samples, progress, label=description) as advance:
        for batch in batches:
            inputs = {k: v.to(device) for k, v in batch.items()}
            if "inputs_embeds" in inputs:
                inputs["inputs_embeds"] = inputs["inputs_embeds"].to(dtype)
            model(**inputs)
            advance(len(next(iter(batch.values()))))
    return capture.result()
