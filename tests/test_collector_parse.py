"""The collector's text parser and name mapping: exposition-format corner cases, agreement with
prometheus_client's own parser, and known-answer conversions of sing, dcgm-exporter and
node_exporter payloads to SI columns."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Gauge, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from sing.collector.convert import WANTED, Hardware, read_node
from sing.collector.counters import CounterDeltas
from sing.collector.promtext import ParseError, parse
from sing.collector.rows import RoundRows
from sing.jobids import job_order

TRICKY = r"""# HELP sing_gpu_power_watts Power draw. Has a { brace and "quotes" in help.
# TYPE sing_gpu_power_watts gauge
sing_gpu_power_watts{gpu="0",uuid="GPU-a"} 301.5
sing_gpu_power_watts{ gpu = "1" , uuid="GPU-b", } 1e+02 1700000000123

sing_gpu_power_watts{gpu="2",uuid="with \"quote\", comma} and \\ backslash\nnewline"} NaN
sing_gpu_power_watts{gpu="3",uuid="GPU-d"} +Inf
sing_gpu_power_watts{gpu="4",uuid="GPU-e"} -Inf
sing_gpu_power_watts_extra{gpu="0"} this line is not wanted and is garbage
sing_gpu_temperature_celsius 42
   # an indented comment line is not a sample
"""


def test_parses_escapes_special_values_timestamps_and_skips_comments() -> None:
    samples = parse(TRICKY, {"sing_gpu_power_watts", "sing_gpu_temperature_celsius"})
    assert [s.labels.get("gpu") for s in samples] == ["0", "1", "2", "3", "4", None]
    assert samples[0].value == 301.5 and samples[0].timestamp_ms is None
    assert samples[1].labels == {"gpu": "1", "uuid": "GPU-b"}
    assert samples[1].value == 100.0 and samples[1].timestamp_ms == 1700000000123
    assert samples[2].labels["uuid"] == 'with "quote", comma} and \\ backslash\nnewline'
    assert math.isnan(samples[2].value)
    assert samples[3].value == math.inf and samples[4].value == -math.inf
    assert samples[5].name == "sing_gpu_temperature_celsius" and samples[5].value == 42


@pytest.mark.parametrize(
    "line",
    [
        'sing_gpu_power_watts{gpu="0" 12',  # unterminated label set
        "sing_gpu_power_watts{gpu=0} 12",  # unquoted value
        'sing_gpu_power_watts{gpu="0"} twelve',
        'sing_gpu_power_watts{gpu="0"} 12 13 14',
        "sing_gpu_power_watts",
    ],
)
def test_malformed_wanted_line_names_its_line(line: str) -> None:
    with pytest.raises(ParseError, match=r"^line 2: "):
        parse("# comment\n" + line + "\n", {"sing_gpu_power_watts"})


# Label values over the characters that need escaping, and then some.
LABEL_TEXT = st.text(alphabet=st.sampled_from('ab\\"\n{},= é\t'), max_size=12)
VALUES = st.floats(allow_nan=False) | st.sampled_from([math.inf, -math.inf, 0.0, 1e300])


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(LABEL_TEXT, VALUES), min_size=1, max_size=6, unique_by=lambda t: t[0]))
def test_agrees_with_prometheus_client_on_what_it_renders(rows) -> None:
    registry = CollectorRegistry()
    gauge = Gauge("sing_gpu_power_watts", "h", ["gpu", "uuid"], registry=registry)
    for i, (uuid, value) in enumerate(rows):
        gauge.labels(str(i), uuid).set(value)
    text = generate_latest(registry).decode()
    ours = [(s.labels, s.value) for s in parse(text, {"sing_gpu_power_watts"})]
    (family,) = text_string_to_metric_families(text)
    theirs = [(s.labels, s.value) for s in family.samples]
    assert ours == theirs


SING = """\
sing_gpu_info{gpu="0",uuid="GPU-0",name="NVIDIA H200",minor="0",pci_bus_id="0:18"} 1
sing_gpu_utilization_ratio{gpu="0",uuid="GPU-0"} 0.75
sing_gpu_utilization_ratio{gpu="1",uuid="GPU-1"} 0.25
sing_gpu_memory_used_bytes{gpu="0",uuid="GPU-0"} 1.2e+10
sing_gpu_memory_total_bytes{gpu="0",uuid="GPU-0"} 1.50754820096e+11
sing_gpu_power_watts{gpu="0",uuid="GPU-0"} 512.5
sing_gpu_energy_joules_total{gpu="0",uuid="GPU-0"} 123456.5
sing_gpu_temperature_celsius{gpu="1",uuid="GPU-1"} NaN
sing_gpu_job_info{gpu="0",uuid="GPU-0",job_id="77",user="ann"} 1
sing_gpu_job_info{gpu="1",uuid="GPU-1",job_id="9",user="bob"} 1
sing_gpu_job_info{gpu="1",uuid="GPU-1",job_id="10",user="cy"} 1
sing_rdma_transmit_bytes_total{device="mlx5_0",port="1"} 4.4e+12
sing_rdma_receive_packets_total{device="mlx5_0",port="1"} 1000
"""


def test_sing_names_map_to_columns() -> None:
    reading = read_node(parse(SING, WANTED))
    assert reading.gpus[0] == {
        "gpu_uuid": "GPU-0",
        "util": 0.75,
        "mem_used_bytes": 12_000_000_000,
        "mem_total_bytes": 150_754_820_096,
        "power_w": 512.5,
        "energy_j": 123456.5,
    }
    assert reading.gpus[1] == {"gpu_uuid": "GPU-1", "util": 0.25}  # NaN is left out
    # A GPU shared by two jobs is stamped with the lowest id, compared as numbers (9 < 10).
    assert reading.jobs == {0: "77", 1: "9"}
    assert reading.ports == {("mlx5_0", 1): {"tx_bytes": 4_400_000_000_000, "rx_packets": 1000}}
    # Two GPUs (one only in sing_gpu_info's sense, one only in metrics); the model and memory
    # of the node are what its GPUs report.
    assert reading.hardware() == Hardware(2, "NVIDIA H200", 150_754_820_096)


DCGM = """\
# HELP DCGM_FI_DEV_GPU_UTIL GPU utilization (in %).
# TYPE DCGM_FI_DEV_GPU_UTIL gauge
DCGM_FI_DEV_GPU_UTIL{gpu="3",UUID="GPU-x",device="nvidia3",Hostname="n1",hpc_job="4242"} 87
DCGM_FI_PROF_SM_ACTIVE{gpu="3",UUID="GPU-x",Hostname="n1",hpc_job="4242"} 0.61
DCGM_FI_DEV_FB_USED{gpu="3",UUID="GPU-x",Hostname="n1",hpc_job="4242"} 1024
DCGM_FI_DEV_FB_FREE{gpu="3",UUID="GPU-x",Hostname="n1",hpc_job="4242"} 80000
DCGM_FI_DEV_FB_RESERVED{gpu="3",UUID="GPU-x",Hostname="n1",hpc_job="4242"} 512
DCGM_FI_DEV_POWER_USAGE{gpu="3",UUID="GPU-x",Hostname="n1",hpc_job="4242"} 250.25
DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{gpu="3",UUID="GPU-x",Hostname="n1",hpc_job="4242"} 7500
DCGM_FI_DEV_GPU_TEMP{gpu="3",UUID="GPU-x",Hostname="n1",hpc_job="4242"} 61
DCGM_FI_DEV_GPU_UTIL{gpu="3",UUID="GPU-x",GPU_I_ID="1",GPU_I_PROFILE="1g.10gb"} 5
DCGM_FI_DEV_GPU_UTIL{gpu="4",UUID="GPU-y",Hostname="n1",hpc_job=""} 0
"""


def test_dcgm_exporter_names_convert_to_si() -> None:
    reading = read_node(parse(DCGM, WANTED))
    mib = 1024 * 1024
    assert reading.gpus[3] == {
        "gpu_uuid": "GPU-x",
        "util": 0.87,  # percent -> ratio; the MIG instance line does not overwrite it
        "sm_active": 0.61,
        "mem_used_bytes": 1024 * mib,
        "mem_total_bytes": (1024 + 80000 + 512) * mib,  # used + free + reserved MiB
        "power_w": 250.25,
        "energy_j": 7.5,  # mJ -> J
        "temp_c": 61,
    }
    assert reading.jobs == {3: "4242"}  # an empty hpc_job means no job
    assert reading.gpus[4]["util"] == 0
    assert reading.hardware() == Hardware(2, None, (1024 + 80000 + 512) * mib)


def test_dcgm_model_name_label_is_the_gpu_model() -> None:
    line = 'DCGM_FI_DEV_GPU_UTIL{{gpu="{0}",UUID="GPU-{0}",modelName="{1}"}} 5\n'
    text = line.format(0, "NVIDIA A100-SXM4-80GB") + line.format(1, "NVIDIA A100-SXM4-80GB")
    text += line.format(2, "Tesla V100")
    assert read_node(parse(text, WANTED)).hardware() == Hardware(3, "NVIDIA A100-SXM4-80GB", None)


NODE_EXPORTER = """\
node_infiniband_port_data_transmitted_bytes_total{device="mlx5_1",port="1"} 8.0e+09
node_infiniband_port_data_received_bytes_total{device="mlx5_1",port="1"} 2.0e+09
node_infiniband_port_packets_transmitted_total{device="mlx5_1",port="1"} 3e+06
node_infiniband_port_packets_received_total{device="mlx5_1",port="1"} 1e+06
node_infiniband_rate_bytes_per_second{device="mlx5_1",port="1"} 5e+10
"""


def test_node_exporter_infiniband_names() -> None:
    reading = read_node(parse(NODE_EXPORTER, WANTED))
    assert reading.ports == {
        ("mlx5_1", 1): {
            "tx_bytes": 8_000_000_000,
            "rx_bytes": 2_000_000_000,
            "tx_packets": 3_000_000,
            "rx_packets": 1_000_000,
        }
    }
    assert reading.gpus == {}
    assert reading.hardware() is None  # says nothing about GPUs, not that there are none


def test_saturated_counter_is_unknown_whatever_the_order() -> None:
    text = """\
sing_rdma_counter_saturated{device="mlx4_0",port="1",counter="port_xmit_data"} 1
sing_rdma_transmit_bytes_total{device="mlx4_0",port="1"} 17179869180
sing_rdma_receive_bytes_total{device="mlx4_0",port="1"} 1000
sing_rdma_counter_saturated{device="mlx4_0",port="2",counter="port_rcv_data"} 1
sing_rdma_counter_saturated{device="mlx4_0",port="3",counter="port_rcv_data"} 0
"""
    assert read_node(parse(text, WANTED)).ports == {
        ("mlx4_0", 1): {"tx_bytes": None, "rx_bytes": 1000},
        ("mlx4_0", 2): {"rx_bytes": None},  # a port with only unknown counters still has a row
    }


def test_job_order_compares_numbers_as_numbers() -> None:
    ids = ["10", "9", "10_10", "10_2", "x", "100", "9+1"]
    assert sorted(ids, key=job_order) == ["9", "9+1", "10", "10_2", "10_10", "100", "x"]


def test_wanted_metric_without_its_key_label_is_an_error() -> None:
    with pytest.raises(ParseError, match="no 'gpu' label"):
        read_node(parse("sing_gpu_power_watts 12\n", WANTED))
    with pytest.raises(ParseError, match="port label 'x' is not a number"):
        read_node(parse('sing_rdma_receive_bytes_total{device="m",port="x"} 1\n', WANTED))


def test_energy_deltas_are_floats_and_an_unknown_value_breaks_the_chain() -> None:
    d = CounterDeltas()
    assert d.delta("g", 100.5) is None
    assert d.delta("g", 160.75) == pytest.approx(60.25)
    assert d.delta("g", 12.5) == 12.5  # driver reload: joules since it restarted from zero
    snapshot = d.copy()
    assert d.delta("g", None) is None  # unknown: the baseline is forgotten
    assert d.delta("g", 5000.0) is None  # so no delta across the gap, however large
    assert snapshot.delta("g", 20.0) == 7.5  # a snapshot keeps its own state


def test_counter_deltas_handle_first_value_resets_and_seeds() -> None:
    d = CounterDeltas()
    assert d.delta("p", 1000) is None  # nothing to compare with yet
    assert d.delta("p", 1500) == 500
    assert d.delta("p", 1500) == 0
    assert d.delta("p", 200) == 200  # reset (reboot): 200 bytes since it restarted from zero
    assert d.delta("p", None) is None
    assert d.delta("p", 300) is None  # after an unknown value, starts over
    d.seed("q", 10)
    d.seed("q", 99)  # a seed never overrides a value already known
    assert d.delta("q", 25) == 15


@given(st.lists(st.integers(min_value=0, max_value=2**63 - 1), max_size=50))
def test_counter_deltas_are_never_negative(values: list[int]) -> None:
    d = CounterDeltas()
    deltas = [d.delta("k", v) for v in values]
    assert all(x is None or x >= 0 for x in deltas)
    # Without resets the deltas add up to the counter's growth.
    if values and values == sorted(values):
        assert sum(x or 0 for x in deltas) == values[-1] - values[0]


def test_saturated_port_gets_null_bytes_and_no_bogus_delta_after_it() -> None:
    """A 32-bit counter runs to its limit, is reported unknown for two rounds, then is cleared
    and counts again: NULL while unknown, no delta on return, true deltas after."""
    known = 'sing_rdma_transmit_bytes_total{{device="mlx4_0",port="1"}} {}\n'
    stuck = 'sing_rdma_counter_saturated{device="mlx4_0",port="1",counter="port_xmit_data"} 1\n'
    payloads = [known.format(16e9), stuck, stuck, known.format(4000), known.format(9000)]
    rows = RoundRows(CounterDeltas())
    start = datetime(2026, 1, 5, tzinfo=UTC)
    for i, text in enumerate(payloads):
        rows.add_node(start + timedelta(seconds=15 * i), "c", "n1", read_node(parse(text, WANTED)))
    rdma = rows.tables()["rdma_samples"].select(["tx_bytes", "tx_delta_bytes", "cluster"])
    assert rdma.to_pylist() == [
        {"tx_bytes": 16_000_000_000, "tx_delta_bytes": None, "cluster": "c"},
        {"tx_bytes": None, "tx_delta_bytes": None, "cluster": "c"},
        {"tx_bytes": None, "tx_delta_bytes": None, "cluster": "c"},
        {"tx_bytes": 4000, "tx_delta_bytes": None, "cluster": "c"},  # not 4000 as if a reset
        {"tx_bytes": 9000, "tx_delta_bytes": 5000, "cluster": "c"},
    ]


def test_an_exporter_reading_the_prolog_mapping_is_not_overruled_by_stale_allocations() -> None:
    """The last job sync still lists job 8 on n1's GPUs 0-1 after it ended. A node whose exporter
    reads the prolog's mapping and names no job for them has them free; a node whose exporter
    has no mapping (or a dcgm-exporter payload) falls back to the allocations."""
    util = 'sing_gpu_utilization_ratio{{gpu="{g}",uuid="GPU-{g}"}} 0.5\n'
    gpus = util.format(g=0) + util.format(g=1)
    held = 'sing_gpu_job_info{gpu="1",uuid="GPU-1",job_id="9",user="u"} 1\n'
    mapped = "sing_gpu_job_mapping_present 1\n"
    unmapped = "sing_gpu_job_mapping_present 0\n"
    allocations = {("c", node, g): "8" for node in ("n1", "n2") for g in (0, 1)}
    rows = RoundRows(CounterDeltas(), allocations)
    ts = datetime(2026, 1, 5, tzinfo=UTC)
    rows.add_node(ts, "c", "n1", read_node(parse(gpus + held + mapped, WANTED)))
    rows.add_node(ts, "c", "n2", read_node(parse(gpus + held + unmapped, WANTED)))
    samples = rows.tables()["gpu_samples"].select(["node", "gpu_index", "job_id"]).to_pylist()
    assert samples == [
        {"node": "n1", "gpu_index": 0, "job_id": None},
        {"node": "n1", "gpu_index": 1, "job_id": "9"},
        {"node": "n2", "gpu_index": 0, "job_id": "8"},
        {"node": "n2", "gpu_index": 1, "job_id": "9"},
    ]
