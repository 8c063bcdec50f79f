"""Hugging Face models: site mapping, position-use detection, RoPE switch-off, loading errors."""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
from operator import attrgetter
from pathlib import Path

import numpy as np
import pytest
import torch

from helpers import assert_matches_reference, run_cli
from hf_tiny import ARCHITECTURES, LAYERS, ROPE_LAYERS, VOCAB, tiny
from nopelab import limits
from nopelab.config import DEFAULT_SITES, AnalysisConfig, ProbeConfig
from nopelab.errors import ConfigError, UserError
from nopelab.hf import load
from nopelab.hf.positions import position_use, rope_off
from nopelab.hf.sites import ARCHITECTURES as MAPPINGS
from nopelab.hf.sites import HFModel
from nopelab.measure.analysis import analyze_model
from nopelab.measure.metrics import position_variance
from nopelab.measure.sites import sites_of
from nopelab.probing.pipeline import probe_model


def _capture(model: HFModel, idx: torch.Tensor, sites=DEFAULT_SITES, **kwargs) -> dict:
    seen: dict = {}
    keys = model.site_keys(sites)
    handles = sites_of(model).observe(keys, lambda key, h: seen.__setitem__(key, h.clone()))
    try:
        with torch.no_grad():
            model(idx, **kwargs)
    finally:
        for handle in handles:
            handle.remove()
    return seen


@pytest.mark.parametrize("model_type", ARCHITECTURES)
def test_sites_are_the_tensors_the_model_computes(model_type):
    hf = tiny(model_type)
    model = HFModel(hf)
    idx = torch.randint(VOCAB, (2, 12), generator=torch.Generator().manual_seed(1))
    seen = _capture(model, idx)
    assert len(seen) == 1 + 4 * LAYERS
    with torch.no_grad():
        reference = hf(idx, output_hidden_states=True)
    # embed and every layer output but the last are HF's own hidden states ...
    torch.testing.assert_close(seen[("embed", 0)], reference.hidden_states[0])
    for layer in range(1, LAYERS):
        torch.testing.assert_close(seen[("resid_post", layer)], reference.hidden_states[layer])
    # ... and the last layer's is taken before the final norm: norm + head give the logits.
    final_norm = hf.transformer.ln_f if model_type == "gpt2" else hf.model.norm
    logits = hf.lm_head(final_norm(seen[("resid_post", LAYERS)]))
    if model_type == "cohere2":
        logits = logits * hf.config.logit_scale
    torch.testing.assert_close(logits, reference.logits, rtol=1e-4, atol=1e-5)
    # the residual stream adds up: input + attention (+ MLP) = output
    for layer in range(1, LAYERS + 1):
        before = seen[("embed", 0)] if layer == 1 else seen[("resid_post", layer - 1)]
        mid = seen[("resid_mid", layer)]
        torch.testing.assert_close(mid, before + seen[("attn_out", layer)])
        torch.testing.assert_close(seen[("resid_post", layer)], mid + seen[("mlp_out", layer)])


@pytest.mark.parametrize("model_type", ARCHITECTURES)
def test_attn_heads_is_what_the_output_projection_reads(model_type):
    """Checked against a pre-hook of our own on ``o_proj`` (GPT-2: the attention's Conv1D
    ``c_proj``, not the MLP's); the projection of ``attn_heads`` is ``attn_out``."""
    model = HFModel(tiny(model_type))
    projections = [
        block.attn.c_proj if model_type == "gpt2" else block.self_attn.o_proj
        for block in model.layers
    ]
    read = {}
    handles = [
        proj.register_forward_pre_hook(
            lambda _m, args, layer=layer: read.setdefault(layer, args[0])
        )
        for layer, proj in enumerate(projections, start=1)
    ]
    seen = _capture(model, torch.randint(VOCAB, (2, 10)), sites=("attn_heads", "attn_out"))
    for handle in handles:
        handle.remove()
    for layer, proj in enumerate(projections, start=1):
        heads = seen[("attn_heads", layer)]
        torch.testing.assert_close(heads, read[layer], rtol=0, atol=0)  # shape included
        with torch.no_grad():
            torch.testing.assert_close(proj(heads), seen[("attn_out", layer)])


def test_attn_heads_may_be_wider_than_the_model():
    """Qwen3 sets head_dim freely: 4 heads x 16 = 64 wide against d_model 32. Analysis and
    probes take the width the site has."""
    model = HFModel(tiny("qwen3", head_dim=16))
    analysis = AnalysisConfig(seq_len=8, samples=10, batch_size=5, input="tokens", sites=("attn_heads",), device="cpu")  # fmt: skip
    seen = _capture(model, torch.randint(VOCAB, (1, 8)), sites=("attn_heads",))
    assert seen[("attn_heads", 1)].shape == (1, 8, 64)
    result = analyze_model(model, analysis, progress=False)
    assert result.sites[("attn_heads", 4)].cosine.shape == (8, 8)
    probe = ProbeConfig(layers=(1,), probes=("linear-cls",), seeds=1, epochs=1)
    (row,) = probe_model(model, analysis, probe, progress=False)
    assert row["site"] == "attn_heads" and row["layer"] == 1


def test_attn_heads_needs_an_output_projection(monkeypatch):
    """No supported architecture lacks one; a stand-in mapping without it checks the error."""
    monkeypatch.setitem(MAPPINGS, "llama", dataclasses.replace(MAPPINGS["llama"], heads=None))
    model = HFModel(tiny("llama"))
    message = (
        r"^sites: attn_heads needs an attention output projection, which 'llama' lacks; "
        r"allowed: embed, attn_out, resid_mid, mlp_out, resid_post$"
    )
    with pytest.raises(ConfigError, match=message):
        model.site_keys(["attn_heads", "resid_post"])
    with pytest.raises(ConfigError, match=message):
        model.observe([("attn_heads", 1)], lambda key, h: None)
    assert len(model.site_keys()) == 1 + 4 * LAYERS  # the other sites still work


@pytest.mark.parametrize("model_type", ["llama", "gpt2"])
def test_resid_mid_is_what_the_mlp_norm_reads(model_type):
    hf = tiny(model_type)
    model = HFModel(hf)
    block = model.layers[1]
    norm = block.ln_2 if model_type == "gpt2" else block.post_attention_layernorm
    read = {}
    handle = norm.register_forward_pre_hook(lambda module, args: read.setdefault("x", args[0]))
    seen = _capture(model, torch.randint(VOCAB, (1, 10)))
    handle.remove()
    torch.testing.assert_close(seen[("resid_mid", 2)], read["x"])


@pytest.mark.parametrize("model_type", ARCHITECTURES)
def test_position_use_is_measured_per_layer(model_type):
    model = HFModel(tiny(model_type))
    use = position_use(model)
    assert [u.layer for u in use] == list(range(LAYERS + 1))
    assert [u.layer for u in use if u.layer and u.uses_position] == ROPE_LAYERS[model_type]
    assert use[0].uses_position == (model_type == "gpt2")  # GPT-2's learned position table
    for u in use[1:]:
        assert u.change > 1e-3 if u.uses_position else u.change == 0.0


def test_smollm3_polarity_is_read_from_behaviour():
    """``no_rope_layers`` = 1 means 'apply RoPE' in transformers' code; an inverted config
    gives the inverted measurement, whatever the field's name suggests."""
    inverted = HFModel(tiny("smollm3", no_rope_layers=[0, 1, 0, 1]))
    assert [u.layer for u in position_use(inverted) if u.layer and u.uses_position] == [2, 4]


@pytest.mark.parametrize("model_type", ["llama", "llama4_text", "cohere2"])
def test_rope_off_makes_nope_layers(model_type):
    model = HFModel(tiny(model_type))
    idx = torch.randint(VOCAB, (1, 16))
    with torch.no_grad():
        before = model(idx)
    with rope_off(model, [1, 2]):
        use = position_use(model)
        with torch.no_grad():
            during = model(idx)
    expected = [layer for layer in ROPE_LAYERS[model_type] if layer > 2]
    assert [u.layer for u in use if u.layer and u.uses_position] == expected
    assert not torch.allclose(before, during)
    with torch.no_grad():
        torch.testing.assert_close(model(idx), before)  # hooks removed on exit


def test_rope_off_errors():
    with (
        pytest.raises(ConfigError, match="rope_off: gpt2 has no rotary"),
        rope_off(HFModel(tiny("gpt2")), [1]),
    ):
        pass
    with pytest.raises(ConfigError, match=r"outside 1\.\.4"), rope_off(HFModel(tiny("llama")), [5]):
        pass


def test_max_layers_stops_early_and_keeps_the_first_layers():
    hf = tiny("llama")
    full, short = HFModel(hf), HFModel(hf, max_layers=2)
    assert short.site_keys(["resid_post"]) == [("resid_post", 1), ("resid_post", 2)]
    idx = torch.randint(VOCAB, (1, 8))
    seen = _capture(short, idx)
    assert short(idx) is None
    reference = _capture(full, idx)
    for key, value in seen.items():
        torch.testing.assert_close(value, reference[key])


def test_streaming_statistics_match_stored_hidden_states():
    hf = tiny("qwen2")
    model = HFModel(hf)
    cfg = AnalysisConfig(seq_len=16, samples=6, batch_size=4, input="tokens", sites=("resid_post",), device="cpu")  # fmt: skip
    result = analyze_model(model, cfg, progress=False)
    generator = torch.Generator().manual_seed(cfg.seed + 1)
    idx = torch.cat(
        [torch.randint(VOCAB, (n, 16), generator=generator) for n in (4, 2)]
    )  # the same inputs analysis draws
    with torch.no_grad():
        hidden = hf(idx, output_hidden_states=True).hidden_states[2]
    expected = position_variance(hidden).mean(0).numpy()
    np.testing.assert_allclose(result.sites[("resid_post", 2)].variance, expected, rtol=1e-5)


def test_probes_run_on_hf_models():
    hf = tiny("gpt2")
    with torch.no_grad():
        hf.transformer.wpe.weight *= 10  # position plainly encoded at the input
    model = HFModel(hf)
    analysis = AnalysisConfig(seq_len=16, samples=24, batch_size=8, input="tokens", sites=("embed",), device="cpu")  # fmt: skip
    probe = ProbeConfig(probes=("linear-cls",), features=("raw",), seeds=2, epochs=30)
    (row,) = probe_model(model, analysis, probe, progress=False)
    assert (
        row["accuracy"] >= 0.9
    )  # chance is 1/16; GPT-2's learned position table is plain to see at embed


# ------------------------------------------------------------------------- loading


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("llama")
    tiny("llama").save_pretrained(folder)
    return folder


def test_load_model_folder(llama_dir):
    model, tokenizer, files = load.load_model(str(llama_dir))
    assert model.cfg.model_type == "llama" and model.cfg.n_layers == LAYERS
    assert tokenizer is None and files.gguf_file is None
    assert load.parameter_count(files) == sum(p.numel() for p in model.parameters())


def test_loading_errors(tmp_path, llama_dir, monkeypatch):
    with pytest.raises(ConfigError, match="does not exist"):
        load.locate(str(tmp_path / "missing"))
    with pytest.raises(ConfigError, match="not a Hugging Face model folder"):
        load.locate(str(tmp_path))
    fake = tmp_path / "model.gguf"
    fake.write_bytes(b"not a gguf")
    with pytest.raises(ConfigError, match="is not a GGUF file"):
        load.locate(str(fake))
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"GGUF" + bytes(64))
    with pytest.raises(ConfigError, match=r"^model: .*broken.gguf is truncated or damaged"):
        load.load_model(str(broken))
    with pytest.raises(ConfigError, match="hf: needs a path after it"):
        load.locate("")

    remote = tmp_path / "remote"
    remote.mkdir()
    config = json.loads((llama_dir / "config.json").read_text())
    (remote / "config.json").write_text(json.dumps({**config, "auto_map": {"AutoConfig": "x.Y"}}))
    with pytest.raises(ConfigError, match="--trust-remote-code"):
        load.load_model(str(remote))

    other = tmp_path / "other"
    other.mkdir()
    from transformers import OPTConfig

    OPTConfig(hidden_size=16, num_hidden_layers=1, ffn_dim=16, num_attention_heads=2, vocab_size=32).save_pretrained(other)  # fmt: skip
    with pytest.raises(
        ConfigError, match="architecture 'opt' has no site mapping; supported: gpt2"
    ):
        load.load_model(str(other))

    monkeypatch.setattr(load, "available_memory", lambda: 1000)
    with pytest.raises(ConfigError, match=r"needs about .* GiB to load in float32"):
        load.load_model(str(llama_dir))

    # the weights fit but the T x T statistics of every site and layer do not
    monkeypatch.undo()
    monkeypatch.setattr(limits, "available_memory", lambda: 2**20)
    tokens = AnalysisConfig(seq_len=64, samples=2, input="tokens")
    with pytest.raises(UserError, match=r"^--seq-len or --sites: analysing needs about"):
        load.load_run(str(llama_dir), tokens)
    load.load_run(str(llama_dir), tokens, statistics=False)  # probes reduce no statistics


def _gguf(path: Path) -> bytes:
    """A small, complete GGUF file of a llama's metadata and one tensor; returns its bytes."""
    from gguf import GGUFWriter

    writer = GGUFWriter(str(path), "llama")
    writer.add_block_count(2)
    writer.add_context_length(64)
    writer.add_embedding_length(16)
    writer.add_feed_forward_length(32)
    writer.add_head_count(2)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_tensor("token_embd.weight", np.ones((32, 16), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path.read_bytes()


def test_a_truncated_gguf_is_one_line_naming_it(tmp_path):
    whole = _gguf(tmp_path / "whole.gguf")
    assert load.parameter_count(load.locate(str(tmp_path / "whole.gguf"))) == 32 * 16
    cut = tmp_path / "cut.gguf"
    # cuts in the header, the metadata, and the tensor data (its last 2048 bytes)
    for size in (8, 40, 200, len(whole) - 1024, len(whole) - 1):
        cut.write_bytes(whole[:size])
        with pytest.raises(ConfigError, match=rf"^model: {re.escape(str(cut))} is truncated or"):
            load.load_model(str(cut))


def test_cli_refuses_a_truncated_gguf(tmp_path, capsys, monkeypatch):
    trunc = tmp_path / "trunc.gguf"
    trunc.write_bytes(_gguf(tmp_path / "whole.gguf")[:200])
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "out"
    assert run_cli(["analyze", "hf:trunc.gguf", "--out", str(out)], monkeypatch) == 2
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert len(err.splitlines()) == 1, err
    assert err.startswith("nopelab: error: model: trunc.gguf is truncated or damaged"), err
    assert "Traceback" not in captured.out + captured.err
    assert not out.exists()


def test_truncated_safetensors_are_one_line_naming_them(tmp_path, llama_dir):
    folder = tmp_path / "llama"
    shutil.copytree(llama_dir, folder)
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-100])
    with pytest.raises(
        ConfigError, match=rf"^model: {re.escape(str(weights))} is truncated or damaged"
    ):
        load.load_model(str(folder))


def test_cli_analyze_hf(tmp_path, llama_dir, monkeypatch):
    out = tmp_path / "run"
    status = run_cli(
        ["analyze", f"hf:{llama_dir}", "--input", "tokens", "--seq-len", "16", "--samples", "4",
         "--max-layers", "2", "--sites", "attn_heads,attn_out,resid_post", "--device", "cpu",
         "--out", str(out)],
        monkeypatch,
    )  # fmt: skip
    assert status == 0
    summary = json.loads((out / "summary.json").read_text())
    assert {(r["site"], r["layer"]) for r in summary["rows"]} == {
        (site, layer) for site in ("attn_heads", "attn_out", "resid_post") for layer in (1, 2)
    }
    config = json.loads((out / "config.json").read_text())
    assert config["model"]["model_type"] == "llama" and config["model"]["analysed_layers"] == 2
    with np.load(out / "cosine.npz") as cosine:
        assert cosine["attn_out_2"].shape == (16, 16)
    use = summary["position_use"]
    assert [u["layer"] for u in use if u["uses_position"]] == [1, 2]  # the analysed layers
    assert "Which layers use position" in (out / "summary.md").read_text()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--layers", "3"], "--layers: a trained or Hugging Face model fixes the model"),
        (["--input", "data", "--seq-len", "16"], "--input: data needs the model's tokenizer"),
        (["--max-layers", "0"], "--max-layers: must be >= 1"),
        (
            ["--input", "tokens", "--seq-len", "16", "--rope-off", "9"],
            "--rope-off: layer 9 is outside 1..4",
        ),
        (["--rope-off", "x"], "--rope-off: expected comma-separated whole numbers"),
        (["--sites", "attn"], "--sites: unknown value 'attn'"),
    ],
)
def test_cli_analyze_hf_errors(tmp_path, llama_dir, args, message, monkeypatch, capsys):
    out = tmp_path / "run"
    status = run_cli(["analyze", f"hf:{llama_dir}", "--out", str(out), *args], monkeypatch)
    err = capsys.readouterr().err.strip()
    assert status == 2 and message in err and len(err.splitlines()) == 1
    assert not out.exists()


def test_cli_attn_heads_without_output_projection(tmp_path, llama_dir, monkeypatch, capsys):
    """One line, exit 2, nothing written, and the weights are never read."""
    monkeypatch.setitem(MAPPINGS, "llama", dataclasses.replace(MAPPINGS["llama"], heads=None))
    monkeypatch.setattr(load, "check_memory", lambda files: pytest.fail("weights about to load"))
    out = tmp_path / "run"
    args = ["analyze", f"hf:{llama_dir}", "--input", "tokens", "--sites", "attn_heads,attn_out", "--out", str(out)]  # fmt: skip
    assert run_cli(args, monkeypatch) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert "sites: attn_heads needs an attention output projection" in err
    assert "allowed: embed, attn_out, resid_mid, mlp_out, resid_post" in err
    assert not out.exists() and list(tmp_path.iterdir()) == []


def test_cli_rope_off_switches_chosen_layers(tmp_path, llama_dir, monkeypatch):
    out = tmp_path / "run"
    args = ["analyze", f"hf:{llama_dir}", "--input", "tokens", "--seq-len", "16", "--samples", "2",
            "--sites", "resid_post", "--rope-off", "1,3", "--out", str(out)]  # fmt: skip
    assert run_cli(args, monkeypatch) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert [u["layer"] for u in summary["position_use"] if u["uses_position"]] == [2, 4]
    assert json.loads((out / "config.json").read_text())["model"]["rope_off"] == [1, 3]


def test_cli_hf_flags_need_an_hf_model(tmp_path, monkeypatch, capsys):
    status = run_cli(["analyze", "--max-layers", "2", "--out", str(tmp_path / "x")], monkeypatch)
    assert status == 2
    assert "--max-layers: only applies to an hf:PATH model" in capsys.readouterr().err


@pytest.mark.parametrize("model_type", ["llama"])
def test_attention_modules_follow_the_mapping(model_type):
    hf = tiny(model_type)
    model = HFModel(hf)
    assert model.attention_modules()[0] is attrgetter("model.layers")(hf)[0].self_attn


# ------------------------------------------------------------- the real GGUF model


@pytest.fixture(scope="module")
def smollm2():
    from nopelab.experiments.real_model.smollm2 import smollm2_path

    model, tokenizer, _ = load.load_model(str(smollm2_path()))
    return model, tokenizer


@pytest.mark.slow
def test_smollm2_gguf_loads_and_uses_rope_everywhere(smollm2):
    from nopelab.experiments.real_model.smollm2 import text_loss

    model, tokenizer = smollm2
    assert (model.cfg.model_type, model.cfg.total_layers, model.cfg.d_model) == ("llama", 30, 576)
    use = position_use(model)
    assert not use[0].uses_position and all(u.uses_position for u in use[1:])
    x, y = load.TextWindows(tokenizer).windows(64, 4)
    loss = text_loss(model, x, y)
    assert 2.0 < loss < 5.0  # a working English LM (uniform guessing: log 49152 ≈ 10.8)
    with rope_off(model, range(1, 31)):
        assert not any(u.uses_position for u in position_use(model))
        assert text_loss(model, x, y) > loss + 0.5  # trained with RoPE, it needs it


@pytest.mark.reference
@pytest.mark.slow
def test_reproduce_real_model_smoke(tmp_path, monkeypatch):
    out = tmp_path / "real"
    status = run_cli(["reproduce", "real-model", "--scale", "smoke", "--device", "cpu", "--out", str(out)], monkeypatch)  # fmt: skip
    assert status == 0
    summary = json.loads((out / "summary.json").read_text())
    loss = {row["variant"]: row["loss"] for row in summary["loss"]}
    assert loss["rope"] < loss["nope-every-4th"] < loss["nope-all"]
    use = {row["variant"]: row["rope_layers"] for row in summary["position_use"]}
    assert use["rope"] == list(range(1, 31)) and use["nope-all"] == []
    assert use["nope-every-4th"] == [layer for layer in range(1, 31) if layer % 4]
    assert {row["model"] for row in summary["probes"]} == {"rope", "nope-every-4th", "nope-all"}
    for name in ("summary.md", "scores.png", "probes.png", "cosine_rope.png", "positions.parquet"):
        assert (out / name).is_file()
    assert_matches_reference(out, "real-model-smollm2")
