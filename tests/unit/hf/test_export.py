"""Export to Hugging Face: each exportable family round-trips through ``save_pretrained`` and
``AutoModelForCausalLM``; other configurations are refused naming the field; the CLI command."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM

import nopelab.hf.export as export_module
from helpers import run_cli
from nopelab.config import CorpusConfig, ModelConfig, TrainConfig
from nopelab.errors import ConfigError
from nopelab.hf.export import export
from nopelab.models.transformer import Transformer
from nopelab.training.run import TrainRun
from nopelab.training.train import train
from nopelab.training.trained import load_trained

ATOL = 1e-5
VOCAB, T = 48, 16
SWIGLU = dict(norm="rmsnorm", mlp="swiglu")
FAMILIES = [
    (dict(pos_encoding="learned"), "GPT2LMHeadModel"),
    (dict(pos_encoding="learned", bias=True, tie_embeddings=False), "GPT2LMHeadModel"),
    (dict(pos_encoding="none"), "GPT2LMHeadModel"),
    (dict(pos_encoding="rope", **SWIGLU), "LlamaForCausalLM"),
    (dict(pos_encoding="rope", rope_theta=500.0, tie_embeddings=False, **SWIGLU),
     "LlamaForCausalLM"),
    (dict(pos_encoding="none", **SWIGLU), "SmolLM3ForCausalLM"),
    (dict(pos_encoding="rope", nope_layers=(2,), **SWIGLU), "SmolLM3ForCausalLM"),
]  # fmt: skip


def tiny(**overrides: object) -> Transformer:
    values = dict(vocab_size=VOCAB, d_model=32, n_layers=2, n_heads=4, max_seq_len=T, init_std=0.2)
    values.update(overrides)
    return Transformer(ModelConfig(**values)).eval()


def tokens() -> torch.Tensor:
    return torch.randint(0, VOCAB, (2, T), generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize(("overrides", "architecture"), FAMILIES)
def test_export_round_trip(overrides: dict, architecture: str, tmp_path: Path) -> None:
    model = tiny(**overrides)
    export(model, tmp_path / "hf")
    assert (tmp_path / "hf" / "model.safetensors").is_file()
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    assert type(loaded).__name__ == architecture
    assert next(loaded.parameters()).dtype == torch.float32
    idx = tokens()
    with torch.no_grad():
        torch.testing.assert_close(loaded(input_ids=idx).logits, model(idx), atol=ATOL, rtol=0)


def test_gpt2_nope_export_ignores_positions(tmp_path: Path) -> None:
    export(tiny(pos_encoding="none"), tmp_path / "hf")
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    assert not loaded.transformer.wpe.weight.any()
    idx = tokens()[:, : T // 2]
    shifted = torch.arange(T // 2, T).expand(2, -1)
    reversed_ = torch.arange(T // 2).flip(0).expand(2, -1)
    with torch.no_grad():
        plain = loaded(input_ids=idx).logits
        for position_ids in (shifted, reversed_):
            torch.testing.assert_close(
                loaded(input_ids=idx, position_ids=position_ids).logits, plain
            )


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        (dict(pos_encoding="sinusoidal"), "pos_encoding"),
        (dict(pos_encoding="alibi", **SWIGLU), "pos_encoding"),
        (dict(pos_encoding="learned", norm_position="post"), "norm_position"),
        (dict(pos_encoding="none", bidirectional=True), "bidirectional"),
        (dict(pos_encoding="rope"), "norm"),  # rope with layernorm
        (dict(pos_encoding="learned", norm="rmsnorm"), "norm"),
        (dict(pos_encoding="learned", mlp="swiglu"), "mlp"),
        (dict(pos_encoding="none", norm="rmsnorm"), "mlp"),  # rmsnorm with gelu
        (dict(pos_encoding="rope", bias=True, **SWIGLU), "bias"),
    ],
)
def test_unsupported_configs_are_refused(overrides: dict, field: str, tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        export(tiny(**overrides), tmp_path / "hf")
    assert info.value.field == field
    assert "exportable" in str(info.value) and "\n" not in str(info.value)
    assert not (tmp_path / "hf").exists()


def test_a_logit_mismatch_is_an_internal_error(tmp_path: Path, monkeypatch) -> None:
    to_hf = export_module.to_hf

    def broken(model: Transformer):
        hf = to_hf(model)
        with torch.no_grad():
            hf.model.norm.weight.mul_(2)
        return hf

    monkeypatch.setattr(export_module, "to_hf", broken)
    with pytest.raises(RuntimeError, match="logits differ"):
        export(tiny(pos_encoding="rope", **SWIGLU), tmp_path / "hf")
    assert not (tmp_path / "hf").exists()


# ------------------------------------------------------------------------ command line


@pytest.fixture(scope="module")
def text_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny text run (byte tokenizer, so vocabulary 256): RoPE with layer 2 NoPE, SwiGLU."""
    root = tmp_path_factory.mktemp("export")
    corpus = root / "corpus.txt"
    words = np.random.default_rng(0).choice(["alpha", "beta", "gamma", "delta"], 2000)
    corpus.write_text(" ".join(words))
    run = TrainRun(
        model=ModelConfig(
            d_model=32, n_layers=2, n_heads=2, vocab_size=256, max_seq_len=64,
            pos_encoding="rope", nope_layers=(2,), **SWIGLU,
        ),
        train=TrainConfig(
            steps=2, batch_size=4, seq_len=16, warmup=1, eval_every=2, checkpoint_every=2,
            eval_tokens=256, device="cpu",
        ),
        corpus=CorpusConfig(source=str(corpus)),
    )  # fmt: skip
    train(run, root / "run", progress=False)
    return root / "run"


def test_cli_exports_a_trained_run(text_run: Path, tmp_path: Path, capsys, monkeypatch) -> None:
    out = tmp_path / "hf"
    assert run_cli(["export", str(text_run), "--out", str(out), "--seed", "3"], monkeypatch) == 0
    printed = capsys.readouterr()
    assert printed.out.strip() == f"wrote {out} (smollm3)"
    assert "shards" not in printed.err  # no transformers progress bar
    assert (out / "nopelab_tokenizer.json").read_text() == (text_run / "tokenizer.json").read_text()
    readme = (out / "README.md").read_text()
    assert f'from_pretrained("{out}")' in readme and "tokenizer_from_json" in readme
    assert json.loads((out / "config.json").read_text())["no_rope_layers"] == [1, 0]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no staging left
    _, model = load_trained(text_run)
    loaded = AutoModelForCausalLM.from_pretrained(out).eval()
    idx = torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(loaded(input_ids=idx).logits, model(idx), atol=ATOL, rtol=0)


def test_cli_export_needs_force_for_a_non_empty_out(
    text_run: Path, tmp_path: Path, capsys, monkeypatch
) -> None:
    out = tmp_path / "hf"
    out.mkdir()
    (out / "keep.txt").write_text("precious")
    assert run_cli(["export", str(text_run), "--out", str(out)], monkeypatch) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--force" in err, err
    assert [p.name for p in out.iterdir()] == ["keep.txt"]
    # --force replaces only a folder nopelab wrote, never someone else's files
    assert run_cli(["export", str(text_run), "--out", str(out), "--force"], monkeypatch) == 2
    assert "does not hold a nopelab run" in capsys.readouterr().err
    assert [p.name for p in out.iterdir()] == ["keep.txt"]
    out = tmp_path / "hf2"
    assert run_cli(["export", str(text_run), "--out", str(out)], monkeypatch) == 0
    (out / "model.safetensors").unlink()
    assert run_cli(["export", str(text_run), "--out", str(out), "--force"], monkeypatch) == 0
    assert (out / "model.safetensors").is_file()


def test_cli_refuses_an_unexportable_run(tmp_path: Path, capsys, monkeypatch) -> None:
    run = tmp_path / "run"
    run.mkdir()
    cfg = {"model": {"pos_encoding": "alibi"}, "train": {}, "task": {"name": "copy"}}
    (run / "config.json").write_text(json.dumps(cfg))
    out = tmp_path / "hf"
    assert run_cli(["export", str(run), "--out", str(out)], monkeypatch) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "pos_encoding" in err, err
    assert not out.exists()
