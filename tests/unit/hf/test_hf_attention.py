"""Attention entropy of Hugging Face models, read where each architecture forms its logits,
equals what its eager attention returns as probabilities (``output_attentions``)."""

from __future__ import annotations

import json

import pandas as pd
import pytest
import torch

from helpers import run_cli
from hf_tiny import ARCHITECTURES, HEADS, LAYERS, VOCAB, tiny
from nopelab.hf.sites import HFModel
from nopelab.measure.capture import StreamingCapture

B, T = 3, 20  # longer than cohere2's sliding window of 8 in the tiny model


def tokens() -> torch.Tensor:
    return torch.randint(0, VOCAB, (B, T), generator=torch.Generator().manual_seed(1))


def visible_keys(model_type: str, layer: int) -> torch.Tensor:
    """(T, T) the keys each query sees, from the tiny models' construction: causal, and
    cohere2's first three layers within a window of 8 positions."""
    query, key = torch.arange(T)[:, None], torch.arange(T)[None]
    visible = key <= query
    if model_type == "cohere2" and layer <= 3:
        visible &= query - key < 8
    return visible


def reference(model_type: str, idx: torch.Tensor) -> dict[int, tuple[torch.Tensor, ...]]:
    """Per layer, (H, T) entropy and logit variance summed over the batch, and (T,) log of the
    visible key count, from the eager attention's probabilities: the logits are
    log p + a constant per query, so their variance over the visible keys is log p's."""
    hf = tiny(model_type)
    hf.config._attn_implementation = "eager"
    with torch.no_grad():
        out = hf(idx, attention_mask=torch.ones_like(idx), output_attentions=True)
    result = {}
    for layer, probs in enumerate(out.attentions, start=1):
        probs = probs.double()
        visible = visible_keys(model_type, layer)
        entropy = torch.special.entr(probs).sum(-1)
        logp = probs.log().masked_fill(~visible, float("nan"))
        variance = (logp - logp.nanmean(-1, keepdim=True)).square().nanmean(-1)
        result[layer] = (entropy.sum(0), variance.sum(0), visible.sum(-1).double().log())
    return result


@pytest.mark.parametrize("model_type", ARCHITECTURES)
def test_entropy_equals_the_eager_attention(model_type):
    idx = tokens()
    model = HFModel(tiny(model_type))
    with torch.no_grad():
        plain = model(idx)
        with StreamingCapture(model, ["attn_out", "attention"], T) as capture:
            recorded = model(idx)
    assert torch.equal(plain, recorded)  # the same fused attention computes the outputs
    assert model.hf.config._attn_implementation == "sdpa"  # restored
    attention = capture.result().attention
    assert sorted(attention) == list(range(1, LAYERS + 1))
    for layer, (entropy, variance, log_visible) in reference(model_type, idx).items():
        got = attention[layer]
        assert got.head_entropy.shape == (HEADS, T) and got.samples == B
        torch.testing.assert_close(torch.from_numpy(got.head_entropy), entropy / B, rtol=1e-5, atol=1e-6)  # fmt: skip
        torch.testing.assert_close(torch.from_numpy(got.head_logit_variance), variance / B, rtol=1e-4, atol=1e-8)  # fmt: skip
        torch.testing.assert_close(torch.from_numpy(got.uniform_entropy), log_visible)


def test_max_layers_records_the_analysed_layers_only():
    model = HFModel(tiny("llama"), max_layers=2)
    with torch.no_grad(), StreamingCapture(model, ["attn_out", "attention"], T) as capture:
        model(tokens())
    assert sorted(capture.result().attention) == [1, 2]


@pytest.mark.parametrize("model_type", ["gpt2", "llama"])
def test_an_eager_model_keeps_its_own_attention(model_type):
    """Recording calls the function the model ran before: the outputs are bit-identical."""
    idx = tokens()
    model = HFModel(tiny(model_type))
    model.hf.config._attn_implementation = "eager"
    with torch.no_grad():
        plain = model(idx)
        with StreamingCapture(model, ["attn_out", "attention"], T) as capture:
            recorded = model(idx)
    assert torch.equal(plain, recorded) and model.hf.config._attn_implementation == "eager"
    entropy = reference(model_type, idx)[1][0]
    got = torch.from_numpy(capture.result().attention[1].head_entropy)
    torch.testing.assert_close(got, entropy / B, rtol=1e-5, atol=1e-6)


def _hooks(model: torch.nn.Module) -> int:
    return sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules())


def test_an_attention_kernel_it_cannot_read_is_one_line_and_leaves_no_hook():
    from nopelab.errors import ConfigError

    model = HFModel(tiny("llama"))
    model.hf.config._attn_implementation = "flex_attention"
    with pytest.raises(ConfigError, match="reads the logits through sdpa or eager attention"):
        StreamingCapture(model, ["attn_out", "attention"], T)
    assert model.hf.config._attn_implementation == "flex_attention" and _hooks(model) == 0


def test_a_second_recording_of_one_model_is_refused_and_leaves_no_hook():
    from nopelab.errors import ConfigError

    model = HFModel(tiny("llama"))
    with StreamingCapture(model, ["attn_out", "attention"], T):
        before = _hooks(model)
        second = StreamingCapture(model, ["resid_post"], T)  # no attention: fine
        with second:
            pass
        with pytest.raises(ConfigError, match="already being recorded"):
            StreamingCapture(model, ["attn_out", "attention"], T)
        assert _hooks(model) == before
    assert _hooks(model) == 0 and model.hf.config._attn_implementation == "sdpa"


def test_a_capture_that_fails_to_start_removes_its_hooks(monkeypatch):
    import nopelab.hf.attention as recording

    model = HFModel(tiny("llama"))
    capture = StreamingCapture(model, ["attn_out", "attention"], T)
    monkeypatch.setattr(recording, "record_attention", lambda *a: (_ for _ in ()).throw(OSError))
    with pytest.raises(OSError):
        capture.__enter__()
    assert _hooks(model) == 0


def test_attention_that_never_runs_is_a_failed_run():
    """An architecture whose attention bypasses the attention function records nothing."""
    from nopelab.errors import RunFailed

    model = HFModel(tiny("llama"))
    with torch.no_grad(), StreamingCapture(model, ["attn_out", "attention"], T) as capture:
        model.hf.config._attn_implementation = "sdpa"  # as if nopelab's function were skipped
        model(tokens())
    with pytest.raises(RunFailed, match="attention of layer 1 was never computed"):
        capture.result()


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory):
    folders = {}
    for model_type in ("llama", "gpt2"):
        folders[model_type] = tmp_path_factory.mktemp(model_type)
        tiny(model_type).save_pretrained(folders[model_type])
    return folders


def test_cli_analyze_hf_attention_entropy_past_the_position_limit(tmp_path, model_dirs, monkeypatch):  # fmt: skip
    """A rotary model is analysed past its max_position_embeddings (128), with entropy."""
    out = tmp_path / "run"
    args = ["analyze", f"hf:{model_dirs['llama']}", "--input", "tokens", "--seq-len", "160", "--samples", "2",
            "--sites", "attn_out,attention", "--out", str(out)]  # fmt: skip
    assert run_cli(args, monkeypatch) == 0
    table = pd.read_parquet(out / "attention_heads.parquet")
    assert len(table) == LAYERS * HEADS * 160
    assert json.loads((out / "config.json").read_text())["analysis"]["sites"] == [
        "attn_out",
        "attention",
    ]


def test_cli_a_learned_position_table_ends(tmp_path, model_dirs, monkeypatch, capsys):
    out = tmp_path / "run"
    args = ["analyze", f"hf:{model_dirs['gpt2']}", "--seq-len", "200", "--out", str(out)]
    assert run_cli(args, monkeypatch) == 2
    err = capsys.readouterr().err.strip()
    assert err.endswith("--seq-len: 200 exceeds the model's table of 128 positions"), err
    assert not out.exists()
