"""Build nopelab's default text corpus from the Debian package ``sword-text-web``.

The package holds the World English Bible (public domain) as a SWORD zText module:
OSIS XML split into zlib-compressed blocks. Per testament (``ot``/``nt``):

* ``.bzs``: one record per block, three little-endian uint32: offset and compressed size
  in ``.bzz``, and the uncompressed size;
* ``.bzv``: one record per verse slot in versification order (headings included):
  uint32 block number, uint32 offset and uint16 size within the uncompressed block;
* ``.bzz``: the compressed blocks.

The output is plain UTF-8 English, one verse per line (a paragraph per line where the module
stores several verses in one slot), in the module's canonical book order, with tags,
headings, footnotes, cross-references and the front and back matter removed.

Usage::

    apt-get download sword-text-web
    python scripts/build_corpus.py sword-text-web_426.0-1_all.deb            # -> src/nopelab/data/web.txt.xz
    python scripts/build_corpus.py extracted_dir -o web.txt                  # plain text
"""

from __future__ import annotations

import argparse
import hashlib
import html
import io
import lzma
import re
import tarfile
import tempfile
import zlib
from collections.abc import Iterator
from pathlib import Path

import numpy as np

DEFAULT_OUTPUT = Path(__file__).resolve().parents[1] / "src" / "nopelab" / "data" / "web.txt.xz"
BLOCK = np.dtype([("offset", "<u4"), ("csize", "<u4"), ("usize", "<u4")])
VERSE = np.dtype([("block", "<u4"), ("offset", "<u4"), ("size", "<u2")])

# Front matter, book introductions and the glossary are milestoned divs: drop from the start
# milestone to the matching end milestone (or to the end of the verse slot).
_MATTER = re.compile(
    r'<div [^>]*sID="([^"]+)"[^>]*type="(?:front|introduction|glossary)"[^>]*/>'
    r'.*?(?:<div eID="\1"[^>]*/>|\Z)',
    re.S,
)
_NOTE = re.compile(r"(?:<note\b[^>]*>.*?</note>)+", re.S)
# Headings and speaker labels are not running text; canonical psalm titles are kept.
_HEADING = re.compile(
    r'<title\b(?![^>]*canonical="true")[^>]*>.*?</title>|<speaker\b[^>]*>.*?</speaker>', re.S
)
_PARAGRAPH = re.compile(r'<div [^>]*sID="[^"]*"[^>]*type="x-p"[^>]*/>')
_BLOCK_TAG = re.compile(r"</?(?:div|chapter|milestone|l|lg|lb|list|item|title)\b[^>]*>")
_INLINE_TAG = re.compile(r"<[^>]*>")
_NOTE_MARK = "\x00"
# A removed note between two words (``God<note>…</note>created``) stands for a space.
_JOINED = re.compile(r"(?<=[\w.,;:!?’”)])\x00(?=[\w“‘(])")


def find_module(root: Path) -> Path:
    """The folder under ``root`` holding ``ot.bzs`` and ``nt.bzs``."""
    for bzs in sorted(root.rglob("nt.bzs")):
        if (bzs.parent / "ot.bzs").is_file():
            return bzs.parent
    raise SystemExit(f"no SWORD zText module (ot.bzs, nt.bzs) under {root}")


def extract_deb(deb: Path, dest: Path) -> None:
    """Unpack the data member of a Debian package (an ar archive) into ``dest``."""
    data = deb.read_bytes()
    if not data.startswith(b"!<arch>\n"):
        raise SystemExit(f"{deb} is not a Debian package")
    pos = 8
    while pos + 60 <= len(data):
        name = data[pos : pos + 16].decode().strip().rstrip("/")
        size = int(data[pos + 48 : pos + 58])
        if name.startswith("data.tar"):
            member = io.BytesIO(data[pos + 60 : pos + 60 + size])
            try:
                with tarfile.open(fileobj=member, mode="r:*") as tar:
                    tar.extractall(dest, filter="data")
            except tarfile.ReadError as e:
                raise SystemExit(f"cannot read {name} ({e}); unpack with `dpkg-deb -x`") from e
            return
        pos += 60 + size + size % 2
    raise SystemExit(f"{deb} has no data.tar member")


def verse_slots(module: Path, testament: str) -> Iterator[str]:
    """The OSIS text of each verse slot of one testament, in versification order."""
    blocks_index = np.frombuffer((module / f"{testament}.bzs").read_bytes(), dtype=BLOCK)
    compressed = (module / f"{testament}.bzz").read_bytes()
    blocks = []
    for offset, csize, usize in blocks_index.tolist():
        block = zlib.decompress(compressed[offset : offset + csize])
        assert len(block) == usize, "block size disagrees with its .bzs record"
        blocks.append(block)
    slots = np.frombuffer((module / f"{testament}.bzv").read_bytes(), VERSE)
    sizes = slots["size"].astype(np.int64)
    # The uint16 size wraps for slots over 64 KiB (the Greek Daniel is one slot); the
    # offset of the next slot in the same block gives the true size.
    gap = slots["offset"][1:].astype(np.int64) - slots["offset"][:-1]
    wrapped = (slots["block"][1:] == slots["block"][:-1]) & (gap > sizes[:-1])
    wrapped &= (gap - sizes[:-1]) % 65536 == 0
    sizes[:-1][wrapped] = gap[wrapped]
    for block, offset, size in zip(
        slots["block"].tolist(), slots["offset"].tolist(), sizes.tolist(), strict=True
    ):
        if size:
            yield blocks[block][offset : offset + size].decode("utf-8")


def osis_to_text(osis: str) -> list[str]:
    """Plain-text lines (one per paragraph within the slot) of one verse slot."""
    osis = _MATTER.sub("", osis)
    osis = _NOTE.sub(_NOTE_MARK, osis)
    osis = _HEADING.sub(" ", osis)
    osis = _PARAGRAPH.sub("\n", osis)
    osis = _BLOCK_TAG.sub(" ", osis)
    text = html.unescape(_INLINE_TAG.sub("", osis))
    text = _JOINED.sub(" ", text).replace(_NOTE_MARK, "")
    lines = (" ".join(line.split()) for line in text.split("\n"))
    return [line for line in lines if line]


def build(module: Path) -> str:
    """The whole corpus: Old Testament with deuterocanon, then New Testament."""
    lines = [
        line for t in ("ot", "nt") for slot in verse_slots(module, t) for line in osis_to_text(slot)
    ]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "source", type=Path, help="sword-text-web .deb or a folder it was unpacked to"
    )
    parser.add_argument(
        "-o", "--output", type=Path, default=DEFAULT_OUTPUT, help="output (.xz: compressed)"
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = args.source
        if root.is_file():
            extract_deb(root, Path(tmp))
            root = Path(tmp)
        text = build(find_module(root))
    print(write_text(text, args.output))


def write_text(text: str, output: Path) -> str:
    """Write ``text`` as UTF-8 to ``output`` (xz-compressed if it ends in ``.xz``); a report."""
    raw = text.encode("utf-8")
    output.parent.mkdir(parents=True, exist_ok=True)
    if output.suffix == ".xz":
        output.write_bytes(lzma.compress(raw, preset=9 | lzma.PRESET_EXTREME))
    else:
        output.write_bytes(raw)
    return (
        f"{output}: {len(raw):,} bytes of text, {len(text.split()):,} words, "
        f"{text.count(chr(10)):,} lines, {output.stat().st_size:,} bytes written, "
        f"SHA-256 of the text {hashlib.sha256(raw).hexdigest()}"
    )


if __name__ == "__main__":
    main()
