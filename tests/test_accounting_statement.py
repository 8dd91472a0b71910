"""Monthly statements: the HTML a PI reads, parsed back (html.parser) and checked against the
jobs and samples the test wrote through `Warehouse.append`; every figure is worked out by hand.

Account "lab", January 2026 (samples every 15 minutes at 100 W per GPU; a GPU's first sample in
a job is left out of its energy, its delta reaching back before the job):
- alice: H100 node n1, 2 GPUs x 2 h at util 0.5 -> 4 GPU-h allocated, 2 used, 0 idle;
  energy 2 GPUs x 7 steps x 90 kJ = 1.26 MJ = 0.35 kWh.
- bob: n1, 1 GPU x 1 h at util 0 -> 1 GPU-h allocated, 0 used, 1 idle; 3 x 90 kJ = 0.075 kWh.
Charge units 5 (H100 weight 1) of an allocation of 12: balance 7. Carbon at 400 g/kWh:
0.425 kWh -> 0.17 kg. Account "other-lab": one A100 GPU-hour (weight 2) by a user whose name
is HTML, and no allocation.
"""

from __future__ import annotations

from html.parser import HTMLParser
from pathlib import Path

import pytest

from sing.warehouse.store import Warehouse
from tests.test_accounting import add_node
from tests.test_analytics import add_gpu_samples, add_job, at, run_sing

CONFIG = """
[site]
cluster = "test"
[accounting]
gpu_weights = {A100 = 2.0}
allocations = {lab = {"2026-01" = 12.0}}
carbon_intensity = 400.0
"""
NOW = at(48).isoformat()
SHOUTY = "<b>eve</b>"


class Page(HTMLParser):
    """The statement's tables as text: `tables[id]` is a list of rows, a row a list of cells
    (th and td alike); `text` is all the page's text."""

    def __init__(self, html: str) -> None:
        super().__init__()
        self.tables: dict[str, list[list[str]]] = {}
        self.table: str | None = None
        self.cell: list[str] | None = None
        self.text: list[str] = []
        self.feed(html)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "table":
            self.table = dict(attrs).get("id")
            self.tables[self.table] = []
        elif tag == "tr" and self.table:
            self.tables[self.table].append([])
        elif tag in ("td", "th") and self.table:
            self.cell = []

    def handle_endtag(self, tag: str) -> None:
        if tag in ("td", "th") and self.cell is not None:
            self.tables[self.table][-1].append("".join(self.cell).strip())
            self.cell = None
        elif tag == "table":
            self.table = None

    def handle_data(self, data: str) -> None:
        self.text.append(data)
        if self.cell is not None:
            self.cell.append(data)


def write_lab(wh: Warehouse) -> None:
    """The jobs and samples of the module docstring."""
    add_node(wh, "n1", "H100")
    add_node(wh, "n2", "A100")
    add_job(wh, "1", ["n1"], 2, at(0), at(2), user="alice", account="lab")
    add_gpu_samples(wh, "1", "n1", [0, 1], at(0), at(2), 0.5)
    add_job(wh, "2", ["n1"], 1, at(2), at(3), user="bob", account="lab")
    add_gpu_samples(wh, "2", "n1", [0], at(2), at(3), 0.0)
    add_job(wh, "3", ["n2"], 1, at(0), at(1), user=SHOUTY, account="other-lab")
    add_gpu_samples(wh, "3", "n2", [0], at(0), at(1), 1.0)


@pytest.fixture
def lab(tmp_path: Path) -> tuple[Path, Path]:
    wh = Warehouse(tmp_path / "wh")
    write_lab(wh)
    config = tmp_path / "sing.toml"
    config.write_text(CONFIG)
    return config, wh.root


def statement(config: Path, root: Path, *args: str) -> str:
    out = run_sing(
        "--config", str(config), "--warehouse", str(root), "report", "statement", *args,
        "--now", NOW,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_account_statement_figures(lab: tuple[Path, Path], tmp_path: Path) -> None:
    config, root = lab
    out = tmp_path / "lab.html"
    printed = statement(config, root, "--period", "2026-01", "--account", "lab", "--out", str(out))
    assert printed == f"wrote {out}\n"
    page = Page(out.read_text())
    summary = dict(page.tables["summary"])
    assert summary == {
        "Jobs": "2",
        "GPU-hours allocated": "5.0",
        "GPU-hours used (allocated × utilisation)": "2.0",
        "GPU-hours idle": "1.0",
        "GPU-hours without samples": "0.0",
        "Charge units": "5.0",
        "Allocation (charge units)": "12.0",
        "Allocation balance (charge units)": "7.0",
        "Energy (kWh)": "0.42",  # 0.425, in binary a little under
        "Carbon (kg CO2e)": "0.17",
        "Mean wait before start (h)": "0.00",
    }
    heading, *users = page.tables["users"]
    assert heading[:4] == ["User", "Jobs", "Allocated GPU-h", "Used GPU-h"]
    assert users == [
        ["alice", "1", "4.0", "2.0", "0.0", "4.0", "0.35", "0.14"],
        ["bob", "1", "1.0", "0.0", "1.0", "1.0", "0.07", "0.03"],  # 0.075 kWh, 0.03 kg
    ]
    text = " ".join(" ".join(page.text).split())
    assert "account lab, January 2026" in text
    assert "from 2026-01-01 00:00 to 2026-02-01 00:00 UTC" in text
    assert "The period is not over: figures up to 2026-01-07 10:00 UTC" in text  # --now
    assert "energy x a constant 400 g CO2e/kWh" in text  # the method notes
    assert "weight per GPU model (A100 2; others 1)" in text


def test_all_accounts_escape_names_and_say_unknown(lab: tuple[Path, Path], tmp_path: Path):
    """--all writes one file per account; a user name that is HTML is shown, not obeyed; with
    no intensity configured, carbon is "unknown" and the notes say why."""
    config, root = lab
    config.write_text(CONFIG.replace("carbon_intensity = 400.0\n", ""))
    folder = tmp_path / "statements"
    out = statement(config, root, "--period", "2026-01", "--all", str(folder))
    assert out.splitlines() == [
        f"wrote {folder / 'lab-2026-01.html'}",
        f"wrote {folder / 'other-lab-2026-01.html'}",
    ]
    html = (folder / "other-lab-2026-01.html").read_text()
    assert "<b>eve" not in html and "&lt;b&gt;eve&lt;/b&gt;" in html
    page = Page(html)
    summary = dict(page.tables["summary"])
    assert (summary["GPU-hours allocated"], summary["Charge units"]) == ("1.0", "2.0")
    assert summary["Allocation (charge units)"] == "none configured"
    assert summary["Allocation balance (charge units)"] == "n/a"
    assert summary["Carbon (kg CO2e)"] == "unknown"
    assert page.tables["users"][1][:3] == [SHOUTY, "1", "1.0"]
    assert "no carbon intensity configured" in " ".join(" ".join(page.text).split())


def test_unknown_account_and_bad_period_are_clear(lab: tuple[Path, Path], tmp_path: Path):
    config, root = lab
    base = ["--config", str(config), "--warehouse", str(root), "report", "statement"]
    out = run_sing(*base, "--period", "2026-01", "--account", "lba", "--out", str(tmp_path / "x"))
    assert out.returncode == 1
    assert out.stderr == (
        "sing: no jobs and no allocation of account lba in 2026-01 "
        "(accounts then: lab, other-lab)\n"
    )
    out = run_sing(*base, "--period", "2026-13", "--all", str(tmp_path / "d"))
    assert out.returncode == 1 and "2026-13" in out.stderr
    assert not (tmp_path / "x").exists() and not (tmp_path / "d").exists()
