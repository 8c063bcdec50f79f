"""Validation of the configuration dataclasses: every bad value is a one-line ConfigError
that names the field and says what is allowed."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from nopelab.config import (
    DTYPES,
    INITS,
    INPUTS,
    NORM_POSITIONS,
    NORMS,
    POS_ENCODINGS,
    SITES,
    AnalysisConfig,
    ModelConfig,
    RunConfig,
    build,
)
from nopelab.errors import ConfigError, UserError


@contextmanager
def raises_config_error(field: str, *fragments: str) -> Iterator[None]:
    """Expect a one-line ConfigError for ``field`` whose message contains every fragment."""
    with pytest.raises(ConfigError) as info:
        yield
    err = info.value
    assert err.field == field, f"field {err.field!r} != {field!r}"
    message = str(err)
    assert message.startswith(f"{field}: "), message
    assert "\n" not in message, "ConfigError messages are one line"
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} not in {message!r}"


# ------------------------------------------------------------------------------ defaults


def test_defaults_are_valid_and_match_zuo_et_al() -> None:
    cfg = ModelConfig()
    assert (cfg.n_layers, cfg.n_heads, cfg.d_model, cfg.max_seq_len) == (6, 6, 384, 256)
    assert cfg.head_dim == 64
    assert cfg.pos_encoding == "none" and cfg.norm_position == "pre" and not cfg.bias
    RunConfig()  # default model + analysis combination is valid
    assert issubclass(ConfigError, UserError)


def test_configs_are_frozen() -> None:
    cfg = ModelConfig()
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.d_model = 10  # type: ignore[misc]


# -------------------------------------------------------------------- choices (enums)


@pytest.mark.parametrize(
    ("field", "allowed"),
    [
        ("pos_encoding", POS_ENCODINGS),
        ("init", INITS),
        ("norm", NORMS),
        ("norm_position", NORM_POSITIONS),
    ],
)
def test_model_unknown_choice_names_field_and_allowed(field: str, allowed: tuple[str, ...]) -> None:
    with raises_config_error(field, "'bogus'", *allowed):
        ModelConfig(**{field: "bogus"})


@pytest.mark.parametrize(("field", "allowed"), [("input", INPUTS), ("dtype", DTYPES)])
def test_analysis_unknown_choice_names_field_and_allowed(
    field: str, allowed: tuple[str, ...]
) -> None:
    with raises_config_error(field, "'bogus'", *allowed):
        AnalysisConfig(**{field: "bogus"})


def test_every_allowed_choice_is_accepted() -> None:
    for pe in POS_ENCODINGS:
        ModelConfig(pos_encoding=pe, d_model=32, n_heads=4)
    for init in INITS:
        ModelConfig(init=init)
    for norm in NORMS:
        for position in NORM_POSITIONS:
            ModelConfig(norm=norm, norm_position=position)
    for inp in INPUTS:
        AnalysisConfig(input=inp)
    for dtype in DTYPES:
        AnalysisConfig(dtype=dtype)


def test_pos_encoding_is_case_sensitive() -> None:
    with raises_config_error("pos_encoding", "'RoPE'", "rope"):
        ModelConfig(pos_encoding="RoPE")


# ---------------------------------------------------------------------- numeric ranges


def test_d_model_not_divisible_by_n_heads() -> None:
    with raises_config_error("d_model", "100", "n_heads=3"):
        ModelConfig(d_model=100, n_heads=3)


def test_rope_needs_even_head_dim() -> None:
    ModelConfig(d_model=12, n_heads=4)  # head_dim 3 is fine without rope
    with raises_config_error("d_model", "rope", "3"):
        ModelConfig(d_model=12, n_heads=4, pos_encoding="rope")


@pytest.mark.parametrize("value", [0.0, -0.02, -1])
def test_init_std_must_be_positive(value: float) -> None:
    with raises_config_error("init_std", "> 0", repr(value)):
        ModelConfig(init_std=value)


@pytest.mark.parametrize(
    "field", ["vocab_size", "d_model", "n_layers", "n_heads", "max_seq_len", "mlp_ratio"]
)
@pytest.mark.parametrize("value", [0, -4])
def test_sizes_must_be_positive(field: str, value: int) -> None:
    with raises_config_error(field, "> 0"):
        ModelConfig(**{field: value})


@pytest.mark.parametrize(("field", "value"), [("norm_eps", 0.0), ("rope_theta", -1.0)])
def test_other_positive_floats(field: str, value: float) -> None:
    with raises_config_error(field, "> 0"):
        ModelConfig(**{field: value})


@pytest.mark.parametrize("value", [-0.1, 1.0, 1.5])
def test_dropout_range(value: float) -> None:
    with raises_config_error("dropout", "[0, 1)"):
        ModelConfig(dropout=value)


# ------------------------------------------------------------------------- nope_layers


@pytest.mark.parametrize("layer", [0, 7, -1])
def test_nope_layers_out_of_range(layer: int) -> None:
    with raises_config_error("nope_layers", str(layer), "1..6"):
        ModelConfig(pos_encoding="rope", n_layers=6, nope_layers=(layer,))


@pytest.mark.parametrize("pe", ["none", "learned", "sinusoidal"])
def test_nope_layers_need_an_attention_level_encoding(pe: str) -> None:
    with raises_config_error("nope_layers", "rope", "alibi", repr(pe)):
        ModelConfig(pos_encoding=pe, nope_layers=(1,))


@pytest.mark.parametrize("bad", [("2",), (1.0,), (True,)])
def test_nope_layers_must_be_ints(bad: tuple[Any, ...]) -> None:
    with raises_config_error("nope_layers", repr(bad[0])):
        ModelConfig(pos_encoding="rope", nope_layers=bad)


@pytest.mark.parametrize("bad", [2, "2", None])
def test_nope_layers_must_be_a_list(bad: Any) -> None:
    with raises_config_error("nope_layers", "list"):
        ModelConfig(pos_encoding="rope", nope_layers=bad)


def test_nope_layers_list_becomes_tuple_and_drives_attention_pe_layers() -> None:
    cfg = ModelConfig(pos_encoding="rope", n_layers=4, nope_layers=[2, 4])
    assert cfg.nope_layers == (2, 4)
    assert cfg.attention_pe_layers() == [True, False, True, False]
    alibi = ModelConfig(pos_encoding="alibi", n_layers=3, nope_layers=(1,))
    assert alibi.attention_pe_layers() == [False, True, True]
    for pe in ("none", "learned", "sinusoidal"):
        assert ModelConfig(pos_encoding=pe, n_layers=3).attention_pe_layers() == [False] * 3
    assert ModelConfig(pos_encoding="rope", n_layers=3).attention_pe_layers() == [True] * 3
    hash(cfg)  # stays hashable (frozen dataclass of tuples)


# ------------------------------------------------------------------------------- types


@pytest.mark.parametrize(
    ("field", "value", "expected"),
    [
        ("d_model", "64", "int"),
        ("n_layers", 2.0, "int"),
        ("vocab_size", True, "int"),
        ("init_std", "0.02", "float"),
        ("init_std", True, "float"),
        ("bidirectional", 1, "bool"),
        ("bias", "yes", "bool"),
        ("pos_encoding", 3, "str"),
    ],
)
def test_model_wrong_types(field: str, value: Any, expected: str) -> None:
    with raises_config_error(field, f"expected {expected}", repr(value)):
        ModelConfig(**{field: value})


def test_int_accepted_for_float_fields() -> None:
    assert ModelConfig(init_std=1).init_std == 1
    assert ModelConfig(rope_theta=500).rope_theta == 500


@pytest.mark.parametrize(
    ("field", "value", "expected"),
    [("seq_len", "256", "int"), ("seed", 0.5, "int"), ("samples", 1.5, "int")],
)
def test_analysis_wrong_types(field: str, value: Any, expected: str) -> None:
    with raises_config_error(field, f"expected {expected}"):
        AnalysisConfig(**{field: value})


# ------------------------------------------------------------------------ AnalysisConfig


def test_analysis_unknown_site_lists_allowed_sites() -> None:
    with raises_config_error("sites", "'attn_weights'", *SITES):
        AnalysisConfig(sites=("embed", "attn_weights"))


@pytest.mark.parametrize("bad", ["embed", 3])
def test_analysis_sites_must_be_a_list(bad: Any) -> None:
    with raises_config_error("sites", "list"):
        AnalysisConfig(sites=bad)


def test_analysis_sites_not_empty() -> None:
    with raises_config_error("sites", *SITES):
        AnalysisConfig(sites=())


def test_analysis_sites_list_becomes_tuple() -> None:
    assert AnalysisConfig(sites=["embed", "attn_out"]).sites == ("embed", "attn_out")


@pytest.mark.parametrize("value", [0, 1, 2])
def test_analysis_seq_len_at_least_three(value: int) -> None:
    field_error = "> 0" if value == 0 else ">= 3"
    with raises_config_error("seq_len", field_error):
        AnalysisConfig(seq_len=value)


@pytest.mark.parametrize("field", ["samples", "batch_size"])
def test_analysis_counts_positive(field: str) -> None:
    with raises_config_error(field, "> 0"):
        AnalysisConfig(**{field: 0})


def test_analysis_device() -> None:
    for ok in ("auto", "cpu", "cuda", "cuda:1", "mps"):
        AnalysisConfig(device=ok)
    with raises_config_error("device", "'tpu'", "auto", "cpu", "cuda", "mps"):
        AnalysisConfig(device="tpu")


# ----------------------------------------------------------------------------- RunConfig


def test_run_learned_pe_longer_than_table() -> None:
    model = ModelConfig(pos_encoding="learned", max_seq_len=64)
    RunConfig(model=model, analysis=AnalysisConfig(seq_len=64))  # equal length is fine
    with raises_config_error("seq_len", "65", "max_seq_len=64"):
        RunConfig(model=model, analysis=AnalysisConfig(seq_len=65))


@pytest.mark.parametrize("pe", ["none", "sinusoidal", "rope", "alibi"])
def test_run_other_encodings_have_no_length_limit(pe: str) -> None:
    model = ModelConfig(pos_encoding=pe, max_seq_len=64)
    RunConfig(model=model, analysis=AnalysisConfig(seq_len=512))


def test_run_round_trips_through_dict() -> None:
    run = RunConfig(
        model=ModelConfig(pos_encoding="rope", n_layers=3, nope_layers=(2,), init="gpt2"),
        analysis=AnalysisConfig(seq_len=32, sites=("attn_out",), seed=7),
    )
    data = run.to_dict()
    assert set(data) == {"model", "analysis"}
    assert data["model"]["pos_encoding"] == "rope" and data["analysis"]["seed"] == 7
    assert RunConfig.from_dict(data) == run
    assert RunConfig.from_dict({}) == RunConfig()


def test_from_dict_unknown_section() -> None:
    with raises_config_error("config", "'modle'", "model", "analysis"):
        RunConfig.from_dict({"modle": {}})


def test_from_dict_unknown_key_lists_allowed_keys() -> None:
    with raises_config_error("config.model", "'d_modle'", "d_model", "pos_encoding"):
        RunConfig.from_dict({"model": {"d_modle": 64}})
    with raises_config_error("run.analysis", "'seqlen'", "seq_len", "sites"):
        RunConfig.from_dict({"analysis": {"seqlen": 64}}, where="run")


def test_from_dict_section_not_a_table() -> None:
    with raises_config_error("config.model", "table"):
        RunConfig.from_dict({"model": [1, 2]})


def test_from_dict_bad_value_inside_section_names_the_field() -> None:
    with raises_config_error("d_model", "expected int", "'64'"):
        RunConfig.from_dict({"model": {"d_model": "64"}})
    with raises_config_error("seq_len", "max_seq_len=16"):
        RunConfig.from_dict(
            {"model": {"pos_encoding": "learned", "max_seq_len": 16}, "analysis": {"seq_len": 32}}
        )


def test_build_rejects_unknown_keys() -> None:
    cfg = build(ModelConfig, {"d_model": 32, "n_heads": 4}, "m")
    assert cfg == ModelConfig(d_model=32, n_heads=4)
    with raises_config_error("m", "'foo'", "d_model"):
        build(ModelConfig, {"foo": 1}, "m")


def test_error_messages_are_plain_one_liners() -> None:
    """No traceback-style text in the message, just 'field: what is wrong'."""
    with pytest.raises(ConfigError) as info:
        ModelConfig(norm="batchnorm")
    assert str(info.value) == "norm: unknown value 'batchnorm'; allowed: layernorm, rmsnorm"


def test_config_error_survives_pickling() -> None:
    """Errors come back from worker processes (zuo2025 trains models in a process pool)."""
    import pickle

    error = pickle.loads(pickle.dumps(ConfigError("seq_len", "too short")))
    assert isinstance(error, ConfigError) and error.field == "seq_len"
    assert str(error) == "seq_len: too short"


def test_numbers_too_large_for_a_setting_are_config_errors() -> None:
    from nopelab.config import TrainConfig
    from nopelab.training.task_config import TaskConfig

    with pytest.raises(ConfigError, match="lr: must be a finite number"):
        TrainConfig(lr=10**400)  # an int that no float can hold (a long literal in a file)
    with pytest.raises(ConfigError, match=r"max_len: .* allowed: 1\.\.1024"):
        TaskConfig(name="copy", max_len=10**30)
