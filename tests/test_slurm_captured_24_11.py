"""Slurm output captured on real clusters, read by the parsers the Slurm executor uses.

tests/executors_data/slurm-24.11/ is Debian 13's Slurm 24.11.5 (README there): six jobs, 1
COMPLETED (root, 1 GPU), 2 COMPLETED (singtest, 4 GPUs), 3 FAILED with 97 (root, two nodes, 4
GPUs), 4 FAILED with 3 (singtest, 2 GPUs), 5 CANCELLED (root, 1 GPU), 6 RUNNING (singtest, 1 GPU,
limit 1 min); then one job requeued. tests/executors_data/sacct_exitcodes_v0.0.38.txt is Slurm
22.05's `sacct -P -o JobIDRaw,ExitCode` beside sacct_v0.0.38.json. The cluster ran in UTC: the
JSON's epochs and the text's local times agree (1796248549 = 2026-12-02T21:55:49).
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

from sing.executors.slurm_parse import (
    SACCT_TEXT_FIELDS,
    gpu_count,
    parse_sacct,
    parse_sacct_text,
    parse_sinfo,
    parse_squeue,
    parse_tres,
)

DATA = Path(__file__).parent / "executors_data"
V24 = DATA / "slurm-24.11"


def utc(text: str) -> datetime:
    return datetime.fromisoformat(text).replace(tzinfo=UTC)


def columns(path: Path, fields: tuple[str, ...]) -> str:
    """A captured `sacct -P` (header line first) cut to the columns sing asks for, without the
    header (sing runs it with -n)."""
    header, *lines = path.read_text().splitlines()
    index = [header.split("|").index(field) for field in fields]
    return "".join("|".join(line.split("|")[i] for i in index) + "\n" for line in lines)


def test_squeue_24_11_running_jobs() -> None:
    records = {r.job_id: r for r in parse_squeue((V24 / "squeue.json").read_text(), "c")}
    assert sorted(records) == ["2", "5", "6"]
    got = {
        job_id: (r.state, r.user, r.nodes, r.num_gpus, r.gpus, r.start_time, r.end_time)
        for job_id, r in records.items()
    }
    start = utc("2026-12-02T21:55:49")
    assert got == {
        "2": ("RUNNING", "singtest", ("gpu-1",), 4, {"gpu-1": (1, 2, 3, 4)}, start, None),
        "5": ("RUNNING", "root", ("gpu-1",), 1, {"gpu-1": (7,)}, start, None),
        "6": ("RUNNING", "singtest", ("gpu-2",), 1, {"gpu-2": (4,)}, start, None),
    }
    assert records["6"].time_limit_s == 60 and records["2"].time_limit_s is None
    assert records["2"].submit_time == utc("2026-12-02T21:55:47")


def test_sacct_24_11_ended_jobs_with_the_text_beside_them() -> None:
    text = columns(V24 / "sacct-P.txt", SACCT_TEXT_FIELDS)
    records = {r.job_id: r for r in parse_sacct((V24 / "sacct.json").read_text(), text, "c")}
    assert sorted(records) == ["1", "2", "3", "4", "5"]  # 6 is RUNNING: squeue's
    got = {
        job_id: (r.state, r.user, r.exit_code, r.nodes, r.num_gpus, r.end_time)
        for job_id, r in records.items()
    }
    assert got == {
        "1": ("COMPLETED", "root", 0, ("gpu-1",), 1, utc("2026-12-02T21:55:51")),
        "2": ("COMPLETED", "singtest", 0, ("gpu-1",), 4, utc("2026-12-02T21:55:57")),
        "3": ("FAILED", "root", 97, ("gpu-1", "gpu-2"), 4, utc("2026-12-02T21:55:49")),
        "4": ("FAILED", "singtest", 3, ("gpu-2",), 2, utc("2026-12-02T21:55:49")),
        "5": ("CANCELLED", "root", 0, ("gpu-1",), 1, utc("2026-12-02T21:55:53")),
    }
    for r in records.values():
        assert (r.submit_time, r.start_time) == (
            utc("2026-12-02T21:55:47"),
            utc("2026-12-02T21:55:49"),
        )
        assert r.time_limit_s is None  # TimelimitRaw UNLIMITED


def test_sacct_24_11_text_alone() -> None:
    lines = parse_sacct_text(columns(V24 / "sacct-P.txt", SACCT_TEXT_FIELDS))
    assert {job: [(x.user, x.exit_code, x.gpus) for x in runs] for job, runs in lines.items()} == {
        "1": [("root", 0, 1)],
        "2": [("singtest", 0, 4)],
        "3": [("root", 97, 4)],
        "4": [("singtest", 3, 2)],
        "5": [("root", 0, 1)],
        "6": [("singtest", 0, 1)],
    }


def test_requeued_job_without_duplicates_gives_only_the_pending_record() -> None:
    """24.11 without --duplicates lists only the new PENDING record, and no ended run can be
    made of it: why sing runs sacct with --duplicates (docs/executors.md)."""
    dump = (V24 / "sacct-requeued.json").read_text()
    ((job_id, state),) = [(j["job_id"], j["state"]["current"]) for j in json.loads(dump)["jobs"]]
    assert (job_id, state) == (1, ["PENDING"])
    assert parse_sacct(dump, "", "c") == []
    header, only = (V24 / "sacct-requeued-noD-P.txt").read_text().splitlines()
    assert only.split("|") == ["1", "PENDING", "Unknown", "Unknown", ""]


def test_requeued_job_with_duplicates_has_its_ended_run_with_two_gpus() -> None:
    header, *runs = (V24 / "sacct-requeued-P.txt").read_text().splitlines()
    assert header.split("|") == ["JobIDRaw", "State", "Start", "End", "AllocTRES"]
    requeued, pending = (line.split("|") for line in runs)
    assert requeued[:4] == ["1", "REQUEUED", "2026-12-02T22:09:01", "2026-12-02T22:09:03"]
    assert gpu_count(parse_tres(requeued[4], "sacct -P")) == 2
    assert pending[1:] == ["PENDING", "Unknown", "Unknown", ""]  # no allocation: not started
    assert gpu_count(parse_tres(pending[4], "sacct -P")) is None


def test_sinfo_24_11_nodes() -> None:
    """sing reads `sinfo --Node -o '%N|%R|%G'`; the captured `sinfo --json` says what those
    lines hold on 24.11 (node, partition, the gres string)."""
    entries = json.loads((V24 / "sinfo.json").read_text())["sinfo"]
    text = "".join(
        f"{node}|{entry['partition']['name']}|{entry['gres']['total']}\n"
        for entry in entries
        for node in entry["nodes"]["nodes"]
    )
    assert text == "gpu-1|debug|gpu:a100:8\ngpu-2|debug|gpu:a100:8\n"
    assert [(r.node, r.gpus, r.gpu_model, r.partition) for r in parse_sinfo(text)] == [
        ("gpu-1", 8, "a100", "debug"),
        ("gpu-2", 8, "a100", "debug"),
    ]


def test_22_05_exit_codes_file_is_what_the_text_says_and_the_json_does_not() -> None:
    """Slurm 22.05's JSON gives return code 0 for job 1, which exited 3; the captured text has
    the true codes, and sing takes them from there."""
    header, *lines = (DATA / "sacct_exitcodes_v0.0.38.txt").read_text().splitlines()
    assert header == "JobIDRaw|ExitCode"
    codes = dict(line.split("|") for line in lines)
    assert codes == {"1": "3:0", "2": "0:0", "3": "0:0"}
    raw = json.loads((DATA / "sacct_v0.0.38.json").read_text())
    assert {str(j["job_id"]): j["exit_code"]["return_code"] for j in raw["jobs"]} == {
        "1": 0,
        "2": 0,
        "3": 0,
    }
    users = {str(j["job_id"]): j["user"] for j in raw["jobs"]}
    text = "".join(f"{job}|{users[job]}|{code}|\n" for job, code in codes.items())  # no TRES
    records = parse_sacct(json.dumps(raw), text, "c")
    assert {r.job_id: r.exit_code for r in records} == {"1": 3, "2": 0, "3": 0}
