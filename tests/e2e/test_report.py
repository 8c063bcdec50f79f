"""``nopelab report``: a self-contained page with every table and figure, checked in a browser."""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from helpers import run_cli
from nopelab.errors import UserError

ANALYZE = ["--layers", "2", "--heads", "2", "--d-model", "16", "--seq-len", "32", "--samples", "8"]


@pytest.fixture(scope="module")
def analysed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("report") / "run"
    with pytest.MonkeyPatch.context() as monkeypatch:
        assert run_cli(["analyze", *ANALYZE, "--out", str(out)], monkeypatch) == 0
    return out


def _markdown_tables(text: str) -> int:
    return sum(
        bool(re.fullmatch(r"\|(\s*:?-+:?\s*\|)+", line.strip())) for line in text.splitlines()
    )


def test_the_page_holds_every_table_and_figure_byte_for_byte(
    analysed: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    page = tmp_path / "page.html"
    assert run_cli(["report", str(analysed), "--out", str(page)], monkeypatch) == 0
    text = page.read_text()
    pngs = sorted(analysed.rglob("*.png"))
    parquets = sorted(analysed.glob("*.parquet"))
    assert pngs and parquets
    embedded = re.findall(r'src="data:image/png;base64,([^"]+)"', text)
    assert sorted(base64.b64decode(e) for e in embedded) == sorted(p.read_bytes() for p in pngs)
    tables = _markdown_tables((analysed / "summary.md").read_text()) + len(parquets)
    assert text.count("<table") == tables
    assert json.loads((analysed / "config.json").read_text())["model"]["d_model"] == 16
    assert "&quot;d_model&quot;: 16" in text
    assert "src=" not in re.sub(r'src="data:[^"]+"', "", text)  # nothing loaded from elsewhere


def test_the_default_page_lies_beside_the_folder(
    analysed: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    copy = tmp_path / "mine"
    shutil.copytree(analysed, copy)
    assert run_cli(["report", str(copy)], monkeypatch) == 0
    assert (tmp_path / "mine.html").is_file()
    assert run_cli(["report", str(copy)], monkeypatch) == 2  # exists: --force needed
    assert run_cli(["report", str(copy), "--force"], monkeypatch) == 0
    own = tmp_path / "own.html"
    own.write_text("<html>the user's page</html>")
    assert run_cli(["report", str(copy), "--out", str(own), "--force"], monkeypatch) == 2
    assert own.read_text() == "<html>the user's page</html>"


def test_links_out_of_the_folder_are_left_out_with_a_note(
    analysed: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.png").write_bytes(b"SECRET IMAGE BYTES")
    (outside / "secret.md").write_text("SECRET TEXT")
    (outside / "config.json").write_text('{"secret": "SECRET JSON"}')
    run = tmp_path / "run"
    shutil.copytree(analysed, run)
    pngs = sorted(p.read_bytes() for p in run.rglob("*.png"))
    (run / "leak.png").symlink_to(outside / "secret.png")
    (run / "summary.md").unlink()
    (run / "summary.md").symlink_to(outside / "secret.md")
    (run / "config.json").unlink()
    (run / "config.json").symlink_to(outside / "config.json")
    (run / "figures").symlink_to(outside)  # a linked folder
    page = tmp_path / "page.html"
    assert run_cli(["report", str(run), "--out", str(page)], monkeypatch) == 0
    text = page.read_text()
    assert "SECRET" not in text
    embedded = re.findall(r'src="data:image/png;base64,([^"]+)"', text)
    assert sorted(base64.b64decode(e) for e in embedded) == pngs  # the folder's own figures
    note = re.search(r'<p class="note">(.*?)</p>', text)
    assert note is not None
    left_out = re.findall(r"<code>([^<]+)</code>", note.group(1))
    assert left_out == ["config.json", "figures", "leak.png", "summary.md"]


def test_a_linked_folder_gets_its_page_beside_the_link(
    analysed: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    target = tmp_path / "store" / "run"
    shutil.copytree(analysed, target)
    here = tmp_path / "here"
    here.mkdir()
    (here / "mine").symlink_to(target)
    monkeypatch.chdir(here)
    assert run_cli(["report", "mine"], monkeypatch) == 0
    assert capsys.readouterr().out.strip() == f"wrote {here / 'mine.html'}"
    assert (here / "mine.html").is_file()
    assert not (tmp_path / "store" / "run.html").exists()
    assert "<title>nopelab run: mine</title>" in (here / "mine.html").read_text()


@pytest.mark.parametrize(
    ("name", "content", "fragment"),
    [
        ("distance.parquet", b"not a parquet file", "cannot be read as a parquet table"),
        ("summary.md", b"\xff\xfe headline", "is not readable UTF-8 text"),
        ("config.json", b'{"model": ', "cannot be read as JSON"),
    ],
)
def test_a_corrupt_file_is_one_line_naming_it_and_writes_nothing(
    name: str,
    content: bytes,
    fragment: str,
    analysed: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys,
) -> None:
    run = tmp_path / "run"
    shutil.copytree(analysed, run)
    (run / name).write_bytes(content)
    monkeypatch.chdir(tmp_path)
    assert run_cli(["report", "run"], monkeypatch) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert err.startswith(f"nopelab: error: DIR: run/{name} {fragment}"), err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]


def test_a_folder_that_cannot_be_written_is_one_line_naming_out(
    analysed: Path, tmp_path: Path
) -> None:
    """Run without the right to ignore permissions (root keeps every right but that one)."""
    drop = []
    if os.geteuid() == 0:
        if shutil.which("setpriv") is None:
            pytest.skip("root writes into read-only folders; setpriv cannot take that right away")
        drop = ["setpriv", "--bounding-set=-dac_override", "--"]
    shared = tmp_path / "shared"
    shutil.copytree(analysed, shared / "run")
    shared.chmod(0o555)
    cases = {  # the page beside the folder, or in a new folder inside the read-only one
        (): shared / "run.html",
        ("--out", "shared/pages/run.html"): Path("shared/pages/run.html"),
    }
    try:
        for args, page in cases.items():
            done = subprocess.run(
                [*drop, sys.executable, "-m", "nopelab", "report", "shared/run", *args],
                cwd=tmp_path,
                capture_output=True,
                text=True,
                timeout=120,
            )
            assert done.returncode == 2, done.stderr
            assert done.stderr.strip().splitlines() == [
                f"nopelab: error: --out: cannot write {page}: {shared} is not writable; "
                "choose another place"
            ]
            assert sorted(p.name for p in shared.iterdir()) == ["run"]
    finally:
        shared.chmod(0o755)


def test_a_page_that_cannot_be_written_leaves_nothing(tmp_path: Path) -> None:
    from nopelab.html_report import write_page

    (tmp_path / "notes.txt").write_text("the user's file")
    with pytest.raises(UserError, match=r"--out: cannot write .*: Not a directory"):
        write_page(tmp_path / "notes.txt" / "pages" / "run.html", "<html></html>")
    assert [p.name for p in tmp_path.iterdir()] == ["notes.txt"]
    assert (tmp_path / "notes.txt").read_text() == "the user's file"


def test_a_sweep_page_shows_its_results_and_failures(tmp_path: Path) -> None:
    from nopelab.html_report import Contents, kind, render

    sweep = tmp_path / "sweep"
    (sweep / "results").mkdir(parents=True)
    (sweep / "failed").mkdir()
    (sweep / "grid.json").write_text(json.dumps({"command": "train", "axes": {"lr": [1, 2]}}))
    rows = pd.DataFrame({"cell": ["a", "a", "b"], "metric": ["loss"] * 3, "value": [1.5, 2, 3]})
    rows.to_parquet(sweep / "results" / "a.parquet")
    (sweep / "failed" / "c.txt").write_text("--lr: must be > 0 <boom>")
    page = render(sweep)
    assert kind(Contents(sweep)) == "sweep"
    assert "2 finished cells, 3 rows." in page
    assert "<code>c</code>: --lr: must be &gt; 0 &lt;boom&gt;" in page


@pytest.mark.skipif(shutil.which("chromium") is None, reason="Debian's chromium is not installed")
def test_headless_chromium_shows_the_tables_and_decodes_every_image(
    analysed: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert (
        run_cli(["report", str(analysed), "--out", str(tmp_path / "page.html")], monkeypatch) == 0
    )
    # a probe page loads the report in a frame and records what the browser made of it
    (tmp_path / "probe.html").write_text(
        """<!DOCTYPE html><html><body><iframe id="f" src="page.html"></iframe><script>
document.getElementById("f").addEventListener("load", () => {
  const d = document.getElementById("f").contentDocument;
  const images = [...d.images];
  document.body.dataset.result = JSON.stringify({
    tables: d.querySelectorAll("table").length, images: images.length,
    decoded: images.filter(i => i.complete && i.naturalWidth > 0).length});
});
</script></body></html>"""
    )
    browser = ["chromium", "--headless", "--no-sandbox", "--disable-gpu"]
    flags = ["--allow-file-access-from-files", "--virtual-time-budget=10000", "--dump-dom"]
    dom = subprocess.run(
        [*browser, *flags, (tmp_path / "probe.html").as_uri()],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    found = re.search(r'data-result="([^"]+)"', dom)
    assert found, dom[:500]
    result = json.loads(found.group(1).replace("&quot;", '"'))
    pngs = len(list(analysed.rglob("*.png")))
    tables = _markdown_tables((analysed / "summary.md").read_text()) + len(
        list(analysed.glob("*.parquet"))
    )
    assert result == {"tables": tables, "images": pngs, "decoded": pngs}
