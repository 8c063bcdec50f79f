"""``nopelab report``: a self-contained page with every table and figure, checked in a browser."""

from __future__ import annotations

import base64
import json
import re
import shutil
import subprocess
from pathlib import Path

import pandas as pd
import pytest

from conftest import run_cli

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


def test_a_sweep_page_shows_its_results_and_failures(tmp_path: Path) -> None:
    from nopelab.html_report import kind, render

    sweep = tmp_path / "sweep"
    (sweep / "results").mkdir(parents=True)
    (sweep / "failed").mkdir()
    (sweep / "grid.json").write_text(json.dumps({"command": "train", "axes": {"lr": [1, 2]}}))
    rows = pd.DataFrame({"cell": ["a", "a", "b"], "metric": ["loss"] * 3, "value": [1.5, 2, 3]})
    rows.to_parquet(sweep / "results" / "a.parquet")
    (sweep / "failed" / "c.txt").write_text("--lr: must be > 0 <boom>")
    page = render(sweep)
    assert kind(sweep) == "sweep"
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
