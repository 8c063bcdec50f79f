"""One site interface: native, Hugging Face and plain modules; observing and editing sites."""

from __future__ import annotations

import functools
import runpy
from pathlib import Path

import pytest
import torch
from torch import nn

from hf_tiny import ARCHITECTURES, LAYERS, VOCAB, tiny
from nopelab.config import DEFAULT_SITES, SITES, ModelConfig
from nopelab.errors import ConfigError
from nopelab.hf.sites import HFModel
from nopelab.measure.capture import StreamingCapture
from nopelab.measure.metrics import position_variance
from nopelab.measure.sites import ModuleSites, NativeSites, Sites, sites_of
from nopelab.models.transformer import build_model


def _observed(sites: Sites, keys, run) -> dict:
    seen: dict = {}
    handles = sites.observe(keys, lambda key, h: seen.__setitem__(key, h.detach().clone()))
    try:
        with torch.no_grad():
            out = run()
    finally:
        for handle in handles:
            handle.remove()
    seen["logits"] = out
    return seen


@functools.cache
def _hf(model_type: str) -> HFModel:
    """One tiny model per architecture for the module: every test removes its hooks."""
    return HFModel(tiny(model_type))


def _native():
    model = build_model(ModelConfig(d_model=32, n_heads=4, n_layers=2, vocab_size=VOCAB), seed=0)
    idx = torch.randint(VOCAB, (2, 10), generator=torch.Generator().manual_seed(1))
    return model, idx


def test_every_model_kind_is_addressed_by_the_same_names():
    model, _ = _native()
    hf = _hf("llama")
    for sites in (sites_of(model), sites_of(hf)):
        assert isinstance(sites, Sites)
        keys = sites.site_keys(SITES)
        assert keys[0] == ("embed", 0)
        assert {site for site, _ in keys} == set(SITES)
        assert all(layer >= 1 for site, layer in keys if site != "embed")
    with pytest.raises(ValueError, match="unknown site 'attn'; allowed: embed"):
        sites_of(model).site_keys(["attn"])
    with pytest.raises(TypeError, match="ModuleSites"):
        sites_of(nn.Linear(2, 2))  # type: ignore[arg-type]


@pytest.mark.parametrize("site", SITES)
def test_a_native_edit_replaces_the_activation_that_later_sites_read(site):
    model, idx = _native()
    sites = NativeSites(model)
    layer = 0 if site == "embed" else 2
    before = _observed(sites, sites.site_keys(SITES), lambda: model(idx))
    handle = sites.edit((site, layer), lambda h: 2 * h + 1)
    try:
        after = _observed(sites, sites.site_keys(SITES), lambda: model(idx))
    finally:
        handle.remove()
    torch.testing.assert_close(after[(site, layer)], 2 * before[(site, layer)] + 1)
    # what comes before the edited site is untouched, what comes after changes
    keys = sites.site_keys(SITES)
    position = keys.index((site, layer))
    for key in keys[:position]:
        torch.testing.assert_close(after[key], before[key])
    for key in keys[position + 1 :]:
        assert not torch.allclose(after[key], before[key]), key
    assert not torch.allclose(after["logits"], before["logits"])
    # removed: the model is itself again
    with torch.no_grad():
        torch.testing.assert_close(model(idx), before["logits"], rtol=0, atol=0)


def test_an_edit_of_the_last_residual_stream_reaches_the_logits():
    model, idx = _native()
    sites = NativeSites(model)
    before = _observed(sites, [("resid_post", 2)], lambda: model(idx))
    handle = sites.edit(("resid_post", 2), lambda h: h.flip(1))
    try:
        with torch.no_grad():
            edited = model(idx)
    finally:
        handle.remove()
    with torch.no_grad():  # an independent path: the head applied to the flipped stream
        expected = model.lm_head(model.norm_f(before[("resid_post", 2)].flip(1)))
    torch.testing.assert_close(edited, expected)


@pytest.mark.parametrize("model_type", ARCHITECTURES)
def test_a_hugging_face_edit_of_the_last_layer_reaches_the_logits(model_type):
    model = _hf(model_type)
    hf = model.hf
    idx = torch.randint(VOCAB, (2, 10), generator=torch.Generator().manual_seed(1))
    key = ("resid_post", LAYERS)
    before = _observed(model, [key], lambda: model(idx))
    handle = model.edit(key, lambda h: h.flip(1))
    try:
        after = _observed(model, [key], lambda: model(idx))
    finally:
        handle.remove()
    torch.testing.assert_close(after[key], before[key].flip(1))
    final_norm = hf.transformer.ln_f if model_type == "gpt2" else hf.model.norm
    with torch.no_grad():
        expected = hf.lm_head(final_norm(before[key].flip(1)))
    if model_type == "cohere2":
        expected = expected * hf.config.logit_scale
    torch.testing.assert_close(after["logits"], expected)


@pytest.mark.parametrize("model_type", ARCHITECTURES)
@pytest.mark.parametrize("site", ["embed", "attn_heads", "attn_out", "mlp_out", "resid_post"])
def test_a_hugging_face_edit_is_what_the_site_then_shows(model_type, site):
    model = _hf(model_type)
    idx = torch.randint(VOCAB, (2, 10), generator=torch.Generator().manual_seed(1))
    key = (site, 0 if site == "embed" else 2)
    if site == "attn_heads" and key not in model.site_keys(SITES):
        pytest.skip("no attention output projection")
    before = _observed(model, [key], lambda: model(idx))
    handle = model.edit(key, lambda h: 0.5 * h - 1)
    try:
        after = _observed(model, [key], lambda: model(idx))
    finally:
        handle.remove()
    torch.testing.assert_close(after[key], 0.5 * before[key] - 1)
    assert not torch.allclose(after["logits"], before["logits"])


def test_a_hugging_face_resid_mid_and_a_missing_layer_cannot_be_edited():
    model = _hf("llama")
    with pytest.raises(ConfigError, match="edit attn_out instead"):
        model.edit(("resid_mid", 1), lambda h: h)
    with pytest.raises(ConfigError, match="no site attn_out at layer 9"):
        model.edit(("attn_out", 9), lambda h: h)


def test_statistics_of_a_model_nopelab_did_not_build():
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(
        16, 2, dim_feedforward=32, dropout=0.0, batch_first=True, norm_first=True
    )
    encoder = nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False).eval()
    x = torch.randn(6, 12, 16)
    mask = nn.Transformer.generate_square_subsequent_mask(12)
    modules = {}
    for i, block in enumerate(encoder.layers, 1):
        modules[("attn_out", i)], modules[("resid_post", i)] = block.self_attn, block
    sites = ModuleSites(modules)
    with torch.no_grad(), StreamingCapture(sites, ["attn_out", "resid_post"], 12) as capture:
        for half in x.split(3):  # two batches, reduced on the fly
            encoder(half, mask=mask, is_causal=True)
    result = capture.result()
    assert list(result.sites) == [(s, i) for i in (1, 2) for s in ("attn_out", "resid_post")]
    # brute force: run the blocks' parts by hand, keep everything, reduce at once
    kept = {}
    h = x
    with torch.no_grad():
        for i, block in enumerate(encoder.layers, 1):
            a = block.norm1(h)
            kept[("attn_out", i)] = block.self_attn(a, a, a, attn_mask=mask, need_weights=False)[0]
            h = block(h, src_mask=mask, is_causal=True)
            kept[("resid_post", i)] = h
    for key, h in kept.items():
        torch.testing.assert_close(
            torch.as_tensor(result.sites[key].variance), position_variance(h).mean(0).double()
        )


def test_the_foreign_model_example_shows_the_shrinking_variance(capsys):
    runpy.run_path(str(Path(__file__).parents[3] / "examples" / "foreign_model.py"))
    rows = [line.split() for line in capsys.readouterr().out.splitlines()[1:]]
    ratio = {(site, int(layer)): float(r) for site, layer, r, _ in rows}
    assert len(ratio) == 8
    assert ratio[("attn_out", 1)] > 10 * ratio[("resid_post", 1)]


def test_module_sites_are_checked():
    linear = nn.Linear(2, 2)
    with pytest.raises(ValueError, match="embed is layer 0"):
        ModuleSites({("resid_post", 0): linear})
    with pytest.raises(ValueError, match="unknown site 'hidden'"):
        ModuleSites({("hidden", 1): linear})
    sites = ModuleSites({("attn_out", 1): linear})
    assert sites.site_keys(["attn_out"]) == [("attn_out", 1)]
    with pytest.raises(
        ValueError,
        match=r"named as site embed, resid_mid, mlp_out, resid_post; the sites given: attn_out$",
    ):
        sites.site_keys(DEFAULT_SITES)
    with pytest.raises(ValueError, match="no site mlp_out at layer 1; the model has: attn_out 1"):
        sites.observe([("attn_out", 1), ("mlp_out", 1)], lambda key, h: None)
    assert not linear._forward_hooks  # nothing was hooked


def test_hooks_run_in_the_order_they_were_added():
    model, idx = _native()
    sites, key = NativeSites(model), ("attn_out", 1)
    first: dict = {}
    last: dict = {}
    handles = sites.observe([key], lambda k, h: first.__setitem__(k, h.clone()))
    handles.append(sites.edit(key, torch.zeros_like))
    handles += sites.observe([key], lambda k, h: last.__setitem__(k, h.clone()))
    try:
        with torch.no_grad():
            model(idx)
    finally:
        for handle in handles:
            handle.remove()
    assert first[key].abs().sum() > 0  # added before the edit: the original
    assert (last[key] == 0).all()  # added after it: the edited activation


def test_an_edit_may_return_a_strided_tensor_on_a_mixture_of_experts_layer():
    model = _hf("llama4_text")  # its layer 2 routes tokens to experts, (B * T, d) inside
    idx = torch.randint(VOCAB, (2, 10), generator=torch.Generator().manual_seed(1))
    key = ("mlp_out", 2)
    before = _observed(model, [key], lambda: model(idx))
    handle = model.edit(key, lambda h: h.mean(1, keepdim=True).expand_as(h))
    try:
        after = _observed(model, [key], lambda: model(idx))
    finally:
        handle.remove()
    expected = before[key].mean(1, keepdim=True).expand_as(before[key])
    torch.testing.assert_close(after[key], expected)
