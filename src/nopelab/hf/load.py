"""Load a local Hugging Face causal LM (a safetensors folder or a GGUF file) for analysis.

``hf:PATH`` on the command line names either a model folder (``config.json`` plus weights) or a
``.gguf`` file, which transformers dequantises to float32 (it needs the ``gguf`` package). Every
check that can fail for a user's reason runs before the weights are read and ends in a one-line
:class:`~nopelab.errors.ConfigError`: a missing path, a folder that is not a model, remote code
without ``--trust-remote-code``, an architecture without a site mapping (or without the
requested ``attn_heads``), a model that would not fit in the memory available, a GGUF file
transformers cannot read, a weights file that is truncated or damaged.
"""

from __future__ import annotations

import dataclasses
import json
import struct
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from nopelab.config import AnalysisConfig, embedded_names
from nopelab.errors import ConfigError, first_line
from nopelab.extras import need
from nopelab.hf.sites import HFModel, architecture, check_max_layers, check_sites
from nopelab.limits import available_memory, check_statistics
from nopelab.training.corpus import TokenStream, load_text

FIELD = "model"
TAIL = 0.05  # share of an embedded corpus that nopelab's own LMs never train on
GGUF_PEAK = 2.5  # peak memory while dequantising, in multiples of the float32 weights
LOAD_PEAK = 1.5


@dataclass(frozen=True)
class ModelFiles:
    """Where a model's files are: its folder and, for GGUF, the file name inside it."""

    folder: Path
    gguf_file: str | None = None

    @property
    def extra(self) -> dict[str, str]:
        return {"gguf_file": self.gguf_file} if self.gguf_file else {}


def locate(path: str) -> ModelFiles:
    """Check that ``path`` is a model folder or a GGUF file, and that the packages that read it
    are installed (the ``hf`` extra)."""
    need("transformers", "a Hugging Face model (hf:PATH)")
    if not path:
        raise ConfigError(
            FIELD, "hf: needs a path after it: hf:PATH, a model folder or a .gguf file"
        )
    p = Path(path).expanduser()
    if not p.exists():
        raise ConfigError(FIELD, f"{path} does not exist; give a model folder or a .gguf file")
    if p.is_file():
        with p.open("rb") as f:
            if f.read(4) != b"GGUF":
                raise ConfigError(
                    FIELD, f"{path} is not a GGUF file; give a model folder or a .gguf file"
                )
        for module in ("gguf", "accelerate"):  # transformers reads .gguf files with them
            need(module, "a .gguf model file")
        return ModelFiles(p.parent, p.name)
    if not (p / "config.json").is_file():
        ggufs = sorted(p.glob("*.gguf"))
        if len(ggufs) == 1:
            return locate(str(ggufs[0]))
        raise ConfigError(
            FIELD, f"{path} is not a Hugging Face model folder (no config.json, no single .gguf)"
        )
    return ModelFiles(p)


def read_config(files: ModelFiles, trust_remote_code: bool) -> Any:
    """The model's transformers config; remote code needs ``trust_remote_code``."""
    from transformers import AutoConfig

    if files.gguf_file is None:
        try:
            raw = json.loads((files.folder / "config.json").read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise ConfigError(FIELD, f"cannot read {files.folder / 'config.json'}: {e}") from None
        if "auto_map" in raw and not trust_remote_code:
            raise ConfigError(
                FIELD,
                f"{files.folder} runs its own code (auto_map); pass --trust-remote-code only if you trust it",
            )
    try:
        return AutoConfig.from_pretrained(
            files.folder, trust_remote_code=trust_remote_code, **files.extra
        )
    except struct.error as e:  # transformers' GGUF metadata reader, on a file that ends early
        raise _damaged(files, e) from None
    except (OSError, ValueError, KeyError, RuntimeError) as e:
        if files.gguf_file:
            parameter_count(files)  # a file the GGUF reader cannot parse: truncated or damaged
        raise ConfigError(
            FIELD, f"transformers cannot read {_name(files)}: {first_line(e)}"
        ) from None


def parameter_count(files: ModelFiles) -> int:
    """Parameters stored in the model's files, read from their headers (no weights loaded)."""
    if files.gguf_file:
        from gguf import GGUFReader

        try:
            reader = GGUFReader(files.folder / files.gguf_file)
            return sum(int(t.n_elements) for t in reader.tensors)
        except (OSError, ValueError, IndexError, KeyError, struct.error) as e:
            raise _damaged(files, e) from None
    from safetensors import SafetensorError, safe_open

    total = 0
    for path in files.folder.glob("*.safetensors"):
        try:
            with safe_open(path, framework="pt") as f:
                for key in f.keys():  # noqa: SIM118 (safe_open is not a mapping)
                    total += int(np.prod(f.get_slice(key).get_shape()))
        except (OSError, SafetensorError) as e:
            raise ConfigError(FIELD, f"{path} is truncated or damaged ({first_line(e)})") from None
    if total == 0:  # other weight formats: assume two bytes per parameter
        total = sum(p.stat().st_size for p in files.folder.glob("*.bin")) // 2
    return total


def check_memory(files: ModelFiles) -> int:
    """Refuse a model whose float32 weights (and loading peak) would not fit; return its size."""
    params = parameter_count(files)
    need = params * 4 * (GGUF_PEAK if files.gguf_file else LOAD_PEAK)
    have = available_memory()
    if need > have:
        raise ConfigError(
            FIELD,
            f"{_name(files)} has {params / 1e6:.0f} M parameters and needs about {need / 2**30:.1f} GiB "
            f"to load in float32; {have / 2**30:.1f} GiB is available",
        )
    return params


def load_model(
    path: str,
    trust_remote_code: bool = False,
    max_layers: int | None = None,
    check: Callable[[Any, Any], None] | None = None,
) -> tuple[HFModel, Any | None, ModelFiles]:
    """The wrapped model (float32, eval mode), its tokenizer (``None`` if it has none) and files.

    ``check(config, tokenizer)`` runs before the weights are read, for the caller's own checks.
    """
    files = locate(path)
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    config = read_config(files, trust_remote_code)
    architecture(config.model_type)
    check_max_layers(max_layers)  # before the weights are read
    transformers.logging.set_verbosity_error()
    if not sys.stderr.isatty():
        transformers.logging.disable_progress_bar()
    try:
        tokenizer = AutoTokenizer.from_pretrained(
            files.folder, trust_remote_code=trust_remote_code, **files.extra
        )
    except (OSError, ValueError, KeyError, TypeError):
        tokenizer = None
    if check is not None:
        check(config, tokenizer)
    check_memory(files)
    try:
        hf = AutoModelForCausalLM.from_pretrained(
            files.folder, dtype=torch.float32, trust_remote_code=trust_remote_code, **files.extra
        )
    except (OSError, ValueError, KeyError, RuntimeError, ImportError) as e:
        raise ConfigError(
            FIELD, f"transformers cannot load {_name(files)}: {first_line(e)}"
        ) from None
    return HFModel(hf.eval(), max_layers, name=str(path)), tokenizer, files


class TextWindows:
    """Random windows of text in the model's own tokens: an embedded corpus's held-out tail
    (the share nopelab's own LMs never train on), or all of a user's text."""

    vocab_size: int

    def __init__(self, tokenizer: Any, text: str = "default"):
        if embedded_names(text) is not None:
            corpus = load_text(text)
            body = corpus[-int(len(corpus) * TAIL) :]
        else:
            body = load_text(text)
        ids = np.asarray(tokenizer(body, add_special_tokens=False)["input_ids"], dtype=np.int64)
        self.vocab_size = len(tokenizer)
        self.stream = TokenStream(ids[:0], ids)

    def held_out(self, batch_size: int, seq_len: int, generator: torch.Generator) -> Tensor:
        return self.stream.batch("val", batch_size, seq_len, generator)[0]

    def windows(self, seq_len: int, count: int) -> tuple[Tensor, Tensor]:
        """``count`` consecutive non-overlapping windows (x, y) for measuring loss."""
        pairs = list(self.stream.eval_windows("val", seq_len, count))
        return torch.stack([x for x, _ in pairs]), torch.stack([y for _, y in pairs])


@dataclass(frozen=True)
class HFRun:
    """A Hugging Face model and an analysis: what a run directory's ``config.json`` holds."""

    model: dict[str, Any]
    analysis: AnalysisConfig

    def to_dict(self) -> dict[str, Any]:
        return {"model": self.model, "analysis": dataclasses.asdict(self.analysis)}


def load_run(
    path: str,
    analysis: AnalysisConfig,
    text: str = "default",
    max_layers: int | None = None,
    trust_remote_code: bool = False,
    rope_off: tuple[int, ...] | str | None = None,
    statistics: bool = True,
) -> tuple[HFRun, HFModel, TextWindows | None]:
    """Everything ``nopelab analyze hf:PATH`` needs: settings record, model, text source.

    ``rope_off``: layers (1-based) whose RoPE is switched off for the whole run, or ``"all"``.
    ``statistics``: whether the T x T statistics will be reduced (for the memory check).
    """

    def check(config: Any, tokenizer: Any) -> None:
        check_sites(config.model_type, analysis.sites)
        limit = getattr(config, "max_position_embeddings", None) or getattr(
            config, "n_positions", None
        )
        # a learned position table ends; rotary and position-free layers take any length
        if (
            limit is not None
            and analysis.seq_len > limit
            and not architecture(config.model_type).rope
        ):
            raise ConfigError(
                "seq_len", f"{analysis.seq_len} exceeds the model's table of {limit} positions"
            )
        if analysis.input == "data" and tokenizer is None:
            raise ConfigError(
                "input", f"data needs the model's tokenizer; {path} has none (use tokens or random)"
            )
        if statistics:
            layers: Any = getattr(config, "num_hidden_layers", None) or getattr(
                config, "n_layer", 1
            )
            layers = min(int(layers), max_layers or int(layers))
            heads = int(config.num_attention_heads) if analysis.attn_entropy else 0
            check_statistics(analysis, layers, heads)

    model, tokenizer, files = load_model(path, trust_remote_code, max_layers, check)
    if rope_off:
        from nopelab.hf.positions import switch_rope_off

        rope_off = (
            tuple(range(1, model.cfg.n_layers + 1))
            if rope_off == "all"
            else tuple(int(layer) for layer in rope_off)
        )
        switch_rope_off(model, rope_off)
    source = TextWindows(tokenizer, text) if analysis.input == "data" else None
    record = {
        "hf": str(path),
        "gguf_file": files.gguf_file,
        "model_type": model.cfg.model_type,
        "layers": model.cfg.total_layers,
        "analysed_layers": model.cfg.n_layers,
        "d_model": model.cfg.d_model,
        "vocab_size": model.cfg.vocab_size,
        "text": text if analysis.input == "data" else None,
        "rope_off": list(rope_off or ()),
    }
    return HFRun(record, analysis), model, source


def _name(files: ModelFiles) -> str:
    return str(files.folder / files.gguf_file) if files.gguf_file else str(files.folder)


def _damaged(files: ModelFiles, error: Exception) -> ConfigError:
    return ConfigError(FIELD, f"{_name(files)} is truncated or damaged ({first_line(error)})")
