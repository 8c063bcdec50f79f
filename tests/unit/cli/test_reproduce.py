"""`nopelab reproduce`'s run marker: which options make another run (and so another resume)."""

from __future__ import annotations

from nopelab.cli.reproduce import _said
from nopelab.experiments import EXPERIMENTS
from nopelab.experiments.haviv2022.sizes import SCALES


def test_an_option_is_left_out_of_the_marker_only_where_it_changes_nothing() -> None:
    sizes = EXPERIMENTS["haviv2022"].parts["sizes"]
    byte_sizes, bpe_sizes = SCALES["small"].sizes, SCALES["small"].bpe.sizes  # type: ignore[union-attr]
    assert byte_sizes != bpe_sizes

    def said(**options: object) -> dict:
        return _said(sizes, "small", 0, "cpu", options)

    assert said(tokenizer="byte") == {}  # the default: the same run as without it
    assert said(sizes=byte_sizes) == {}  # the scale's own sizes
    assert said(tokenizer="bpe") == {"tokenizer": "bpe"}
    assert said(tokenizer="bpe", sizes=bpe_sizes) == {"tokenizer": "bpe"}
    # the byte scale's sizes are not the BPE models' own: another run than plain --tokenizer bpe
    assert said(tokenizer="bpe", sizes=byte_sizes) == {"tokenizer": "bpe", "sizes": byte_sizes}
    assert said(tokenizer="byte", sizes=bpe_sizes) == {"sizes": bpe_sizes}
