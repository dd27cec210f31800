"""Chakra execution traces: the schema against Chakra's field table, the file framing, the
export -> import round trip against the simulator, ASTRA-sim-style traces, bad input, CLI."""

from __future__ import annotations

import importlib
import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dlcomm.cli import main
from dlcomm.errors import ConfigError
from dlcomm.plan.simulate.chakra import (
    TraceNode,
    encode_varint,
    frame,
    node_message,
    publish,
    read_trace_set,
    schema,
    unframe,
)
from dlcomm.plan.simulate.chakra_exec import ExecConfig, exec_config, run_traces
from dlcomm.plan.simulate.chakra_export import export_chakra
from dlcomm.plan.simulate.iteration import SimConfig, simulate

DATA = Path(__file__).parent / "data"
STAR4 = "fattree:n=4,ports=1,rate=8"        # 1e9 bytes/s per link direction

# et_def.proto's fields (Chakra's schema, the table of the format report): name -> number
NODE_FIELDS = {"id": 1, "name": 2, "type": 3, "ctrl_deps": 4, "data_deps": 5,
               "start_time_micros": 6, "duration_micros": 7, "inputs": 8, "outputs": 9,
               "attr": 10}
ATTR_FIELDS = {"name": 1, "doc_string": 2, "double_val": 3, "double_list": 4, "float_val": 5,
               "float_list": 6, "int32_val": 7, "int32_list": 8, "int64_val": 9,
               "int64_list": 10, "uint32_val": 11, "uint32_list": 12, "uint64_val": 13,
               "uint64_list": 14, "sint32_val": 15, "sint32_list": 16, "sint64_val": 17,
               "sint64_list": 18, "fixed32_val": 19, "fixed32_list": 20, "fixed64_val": 21,
               "fixed64_list": 22, "sfixed32_val": 23, "sfixed32_list": 24,
               "sfixed64_val": 25, "sfixed64_list": 26, "bool_val": 27, "bool_list": 28,
               "string_val": 29, "string_list": 30, "bytes_val": 31, "bytes_list": 32}
OTHER_FIELDS = {"GlobalMetadata": {"version": 1, "attr": 2},
                "IOInfo": {"values": 1, "shapes": 2, "types": 3},
                "Tensor": {"tensor_id": 1, "storage_id": 2, "offset": 3, "num_elem": 4,
                           "elem_bytes": 5, "device": 6}}
NODE_TYPE = {"INVALID_NODE": 0, "METADATA_NODE": 1, "MEM_LOAD_NODE": 2, "MEM_STORE_NODE": 3,
             "COMP_NODE": 4, "COMM_SEND_NODE": 5, "COMM_RECV_NODE": 6, "COMM_COLL_NODE": 7}
COMM_TYPE = {"ALL_REDUCE": 0, "REDUCE": 1, "ALL_GATHER": 2, "GATHER": 3, "SCATTER": 4,
             "BROADCAST": 5, "ALL_TO_ALL": 6, "REDUCE_SCATTER": 7, "REDUCE_SCATTER_BLOCK": 8,
             "BARRIER": 9}


# -- schema and framing ----------------------------------------------------------------
def test_schema_field_numbers_and_enums_are_chakras():
    classes = schema()
    numbers = {f.name: f.number for f in classes["Node"].DESCRIPTOR.fields}
    assert numbers == NODE_FIELDS
    attr = classes["AttributeProto"].DESCRIPTOR
    assert {f.name: f.number for f in attr.fields} == ATTR_FIELDS
    assert [f.name for f in attr.oneofs_by_name["value"].fields] == list(ATTR_FIELDS)[2:]
    for name, fields in OTHER_FIELDS.items():
        assert {f.name: f.number for f in classes[name].DESCRIPTOR.fields} == fields
    for scalar in ("Double", "Int64", "Uint32", "Sfixed64", "Bool", "String", "Bytes"):
        (values,) = classes[f"{scalar}List"].DESCRIPTOR.fields
        assert (values.name, values.number) == ("values", 1)
    enums = classes["Node"].DESCRIPTOR.file.enum_types_by_name
    assert {v.name: v.number for v in enums["NodeType"].values} == NODE_TYPE
    assert {v.name: v.number for v in enums["CollectiveCommType"].values} == COMM_TYPE
    assert classes["Node"].DESCRIPTOR.full_name == "ChakraProtoMsg.Node"


def test_node_bytes_match_the_verified_example():
    """The report's example: oneof values written even when 0 or false, packed deps."""
    node = TraceNode(5, "x", 7, (1, 2), attrs={"comm_type": 0, "comm_size": 1048576,
                                               "is_cpu_op": False})
    expected = (b"\x08\x05\x12\x01x\x18\x07\x2a\x02\x01\x02"
                b"\x52\x0d\x0a\x09comm_type\x48\x00"
                b"\x52\x0f\x0a\x09comm_size\x48\x80\x80\x40"
                b"\x52\x0e\x0a\x09is_cpu_op\xd8\x01\x00")
    assert node_message(node).SerializeToString() == expected


@pytest.mark.parametrize("n, encoded", [(0, "00"), (1, "01"), (127, "7f"), (128, "8001"),
                                        (300, "ac02"), (2**32 - 1, "ffffffff0f")])
def test_varint(n, encoded):
    assert encode_varint(n).hex() == encoded


@settings(max_examples=60, deadline=None)
@given(st.lists(st.binary(max_size=300), max_size=12))
def test_framing_round_trips(messages):
    data = frame(messages)
    assert unframe(data) == messages
    if data:   # any cut inside the stream is caught (a cut at a message boundary is not)
        bounds = {0}
        for m in messages:
            bounds.add(max(bounds) + len(encode_varint(len(m))) + len(m))
        cut = len(data) - 1
        if cut not in bounds:
            with pytest.raises(ConfigError, match="truncated"):
                unframe(data[:cut])


def test_framing_rejects_long_prefixes():
    with pytest.raises(ConfigError, match="32 bits"):
        unframe(b"\xff" * 6)


# -- round trip ------------------------------------------------------------------------
def _round_trip(tmp_path: Path, cfg: SimConfig, **executor) -> tuple[dict, dict, Path]:
    original = simulate(cfg)["summary"]
    folder = tmp_path / "traces"
    publish(folder, lambda tmp: export_chakra(cfg, tmp,
                                              record={"iteration_s": original["iteration_s"]}))
    traces = read_trace_set(folder)
    imported = run_traces(traces, exec_config(traces, **executor))["summary"]
    return original, imported, folder


def test_round_trip_pure_data_parallel(tmp_path):
    cfg = SimConfig("bert-base", "fattree:n=4,ports=1,rate=10", 0, "dp=4,bytes=4")
    original, imported, folder = _round_trip(tmp_path, cfg)
    assert sorted(p.name for p in folder.iterdir()) == [
        "comm_group.json", *(f"dlcomm.{r}.et" for r in range(4))]
    assert json.loads((folder / "comm_group.json").read_text()) == {"1": [0, 1, 2, 3]}
    assert original["exposed_comm_s"] > 0.01 * original["iteration_s"]   # buckets show
    # compute is written in whole microseconds: that is all that differs
    assert imported["iteration_s"] == pytest.approx(original["iteration_s"], rel=1e-4)
    assert imported["recorded_error"] == pytest.approx(0, abs=1e-4)
    assert imported["compute_only_s"] == pytest.approx(original["pipeline_s"], rel=1e-4)
    assert set(imported["node_types"]) == {"COMP_NODE", "COMM_COLL_NODE"}


@pytest.mark.parametrize("topology", ["fattree:n=8,ports=1,rate=100", "torus2d:x=4,y=2"])
def test_round_trip_dp_pp_tp(tmp_path, topology):
    cfg = SimConfig("bert-base", topology, 0, "dp=2,pp=2,tp=2")
    original, imported, folder = _round_trip(tmp_path, cfg)
    assert imported["iteration_s"] == pytest.approx(original["iteration_s"], rel=1e-4)
    assert imported["exposed_comm_s"] == pytest.approx(original["exposed_comm_s"], rel=2e-3)
    traces = read_trace_set(folder)
    groups = traces.groups
    assert sorted(map(sorted, groups.values())) == [[0, 1], [0, 4], [1, 5], [2, 3], [2, 6],
                                                    [3, 7], [4, 5], [6, 7]]
    for rank, nodes in enumerate(traces.ranks):
        ids = [n.id for n in nodes]
        assert ids == list(range(1, len(nodes) + 1))
        assert all(d < n.id for n in nodes for d in n.data_deps)
        for n in nodes:
            if n.type == 7:
                assert rank in groups[n.attrs["pg_name"]] and n.attrs["comm_size"] > 0
            if n.type in (5, 6):
                peer = n.attrs["comm_dst"] if n.type == 5 else n.attrs["comm_src"]
                assert abs(peer - rank) == 2             # the next or previous stage
    sends = [n for n in traces.ranks[0] if n.type == 5]
    assert [n.attrs["comm_tag"] for n in sends] == [0, 1]           # activations of mb 0, 1
    assert all(n.attrs["comm_dst"] == 2 for n in sends)


def test_exported_files_parse_with_an_independently_compiled_schema(tmp_path):
    if importlib.util.find_spec("grpc_tools") is None:
        pytest.skip("grpc_tools (dev extra grpcio-tools) is not installed: cannot compile "
                    "the reference .proto")
    out = tmp_path / "gen"
    out.mkdir()
    (out / "et_def.proto").write_text((DATA / "et_def.proto").read_text())
    subprocess.run([sys.executable, "-m", "grpc_tools.protoc", f"-I{out}",
                    f"--python_out={out}", str(out / "et_def.proto")], check=True,
                   capture_output=True, timeout=60)
    sys.path.insert(0, str(out))
    try:
        pb = importlib.import_module("et_def_pb2")
    finally:
        sys.path.remove(str(out))
    cfg = SimConfig("bert-base", "fattree:n=8,ports=1,rate=100", 0, "dp=2,pp=2,tp=2")
    folder = publish(tmp_path / "t", lambda tmp: export_chakra(cfg, tmp))
    raw = unframe((folder / "dlcomm.2.et").read_bytes())
    meta = pb.GlobalMetadata.FromString(raw[0])
    assert meta.version == "0.0.4" and {a.name for a in meta.attr} == {"generator", "dlcomm"}
    seen = set()
    for data in raw[1:]:
        node = pb.Node.FromString(data)
        assert node.SerializeToString() == data
        kinds = {a.name: a.WhichOneof("value") for a in node.attr}
        seen.add(pb.NodeType.Name(node.type))
        if node.type == pb.COMP_NODE:
            assert kinds == {"is_cpu_op": "bool_val", "num_ops": "int64_val",
                             "tensor_size": "uint64_val"}
        elif node.type == pb.COMM_COLL_NODE:
            assert {k: kinds[k] for k in ("comm_type", "comm_size", "pg_name", "is_cpu_op")} \
                == {"comm_type": "int64_val", "comm_size": "int64_val",
                    "pg_name": "string_val", "is_cpu_op": "bool_val"}
        else:
            assert kinds == {"comm_src": "int32_val", "comm_dst": "int32_val",
                             "comm_tag": "int32_val", "comm_size": "int64_val"}
    assert seen == {"COMP_NODE", "COMM_COLL_NODE", "COMM_SEND_NODE", "COMM_RECV_NODE"}
    from google.protobuf import descriptor_pb2
    theirs, ours = descriptor_pb2.FileDescriptorProto(), descriptor_pb2.FileDescriptorProto()
    pb.DESCRIPTOR.CopyToProto(theirs)
    schema()["Node"].DESCRIPTOR.file.CopyToProto(ours)
    assert ours == theirs


# -- ASTRA-sim-style traces, written by hand -----------------------------------------
def _attr(name: str, key: bytes, value: bytes) -> bytes:
    body = b"\x0a" + bytes([len(name)]) + name.encode() + key + value
    return b"\x52" + encode_varint(len(body)) + body


def _write_astra(folder: Path, nodes_of_rank: list[list[bytes]], prefix="chakra_trace"):
    folder.mkdir(exist_ok=True)
    for rank, nodes in enumerate(nodes_of_rank):
        (folder / f"{prefix}.{rank}.et").write_bytes(frame([b"\x0a\x050.0.4", *nodes]))


def _allreduce_node(node_id: int = 1, size: bytes = b"\x80\x80\x40") -> bytes:
    """ASTRA-sim's minimal trace: one all-reduce of 1 MiB (its gen_chakra_traces.py)."""
    return (b"\x08" + bytes([node_id]) + b"\x18\x07" + _attr("is_cpu_op", b"\xd8\x01", b"\x00")
            + _attr("comm_type", b"\x48", b"\x00") + _attr("comm_size", b"\x48", size))


def test_reads_an_astra_sim_all_reduce(tmp_path):
    _write_astra(tmp_path / "ar", [[_allreduce_node(r + 1)] for r in range(4)])
    traces = read_trace_set(tmp_path / "ar")
    out = run_traces(traces, ExecConfig(STAR4, alpha_us=0, hop_latency_us=0))["summary"]
    assert out["collectives"] == {"ALL_REDUCE": 1}
    assert out["iteration_s"] == pytest.approx(1.5 * 2**20 / 1e9)      # 2(g-1)/g n / B
    ring = run_traces(traces, ExecConfig(STAR4, algorithm="ring"))["summary"]
    latency = 2 * 3 * (1e-6 + 2 * 0.5e-6)          # 2(g-1) steps of alpha + 2 hops
    assert ring["iteration_s"] == pytest.approx(1.5 * 2**20 / 1e9 + latency)


def test_reads_astra_sim_send_recv_with_compute(tmp_path):
    """Custom-collective style: SEND (comm_size, comm_dst, comm_tag, a stray comm_type),
    RECV (comm_size, comm_src, comm_tag), COMP of 7 us between, a data_deps chain."""
    def send(dst: int) -> bytes:
        return (b"\x08\x02\x18\x05\x2a\x01\x01" + _attr("comm_size", b"\x48", b"\x80\x80\x40")
                + _attr("comm_dst", b"\x38", bytes([dst])) + _attr("comm_tag", b"\x38", b"\x07")
                + _attr("comm_type", b"\x48", b"\x05"))

    def recv(src: int) -> bytes:
        return (b"\x08\x02\x18\x06\x2a\x01\x01" + _attr("comm_size", b"\x48", b"\x80\x80\x40")
                + _attr("comm_src", b"\x38", bytes([src])) + _attr("comm_tag", b"\x38", b"\x07"))
    comp = b"\x08\x01\x12\x01c\x18\x04\x38\x07"
    after = b"\x08\x03\x18\x04\x38\x07\x2a\x01\x02"
    _write_astra(tmp_path / "p2p", [[comp, send(1), after], [comp, recv(0), after]])
    out = run_traces(read_trace_set(tmp_path / "p2p"),
                     ExecConfig("fattree:n=2,ports=1,rate=8", alpha_us=0, hop_latency_us=0))
    assert out["summary"]["iteration_s"] == pytest.approx(14e-6 + 2**20 / 1e9)
    assert out["summary"]["compute_only_s"] == pytest.approx(14e-6)


# -- bad input -------------------------------------------------------------------------
def _coll(node_id: int, comm_type: int = 0, size: int = 1024, pg: str | None = None,
          deps: tuple[int, ...] = ()) -> TraceNode:
    attrs = {"comm_type": comm_type, "comm_size": size, **({"pg_name": pg} if pg else {})}
    return TraceNode(node_id, f"c{node_id}", 7, deps, attrs=attrs)


def _float_size() -> bytes:
    """An all-reduce whose comm_size is a double (ASTRA-sim cannot cast it to an integer)."""
    msg = node_message(TraceNode(1, "c", 7, attrs={"comm_type": 0}))
    msg.attr.add(name="comm_size", double_val=1.5)
    return msg.SerializeToString()


def _write(folder: Path, ranks: list[list[TraceNode | bytes]],
           groups: dict | None = None) -> Path:
    folder.mkdir(exist_ok=True)
    meta = schema()["GlobalMetadata"](version="0.0.4").SerializeToString()
    for r, nodes in enumerate(ranks):
        body = [n if isinstance(n, bytes) else node_message(n).SerializeToString()
                for n in nodes]
        (folder / f"t.{r}.et").write_bytes(frame([meta, *body]))
    if groups is not None:
        (folder / "comm_group.json").write_text(json.dumps(groups))
    return folder


BAD = {
    "never meets": ([[_coll(1)], [TraceNode(1, "idle", 4, duration_micros=3)]],
                    None, "never met: rank(s) [1]"),
    "sizes disagree": ([[_coll(1, size=8)], [_coll(1, size=16)]], None, "disagree"),
    "unknown node type": ([[TraceNode(1, "odd", 9)], [TraceNode(1, "odd", 9)]], None,
                          "node type 9 is not supported"),
    "memory node": ([[TraceNode(1, "load", 2)], [_coll(1)]], None, "MEM_LOAD_NODE"),
    "barrier": ([[_coll(1, 9)], [_coll(1, 9)]], None, "BARRIER is not supported"),
    "missing dependency": ([[_coll(1, deps=(7,))], [_coll(1)]], None, "depends on node 7"),
    "duplicate id": ([[_coll(1), _coll(1)], [_coll(1)]], None, "appears twice"),
    "cycle": ([[TraceNode(1, "a", 4, (2,)), TraceNode(2, "b", 4, (1,))],
               [TraceNode(1, "c", 4)]], None, "never became ready"),
    "unknown group": ([[_coll(1, pg="5")], [_coll(1, pg="5")]], {"1": [0, 1]},
                      "unknown communicator group '5'"),
    "group id 0": ([[_coll(1)], [_coll(1)]], {"0": [0, 1]}, "integer >= 1"),
    "rank twice": ([[_coll(1, pg="1")], [_coll(1, pg="1")]], {"1": [0, 0]}, "a rank twice"),
    "float size": ([[_float_size()], [_coll(1)]], None, "must be an integer"),
    "no comm_size": ([[TraceNode(1, "c", 7, attrs={"comm_type": 0})], [_coll(1)]], None,
                     "needs attribute 'comm_size'"),
    "unmatched receive": ([[TraceNode(1, "r", 6, attrs={"comm_src": 1, "comm_tag": 3,
                                                        "comm_size": 8})], []], None,
                          "never matched a send"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_traces_are_one_line_errors(tmp_path, case):
    ranks, groups, message = BAD[case]
    folder = _write(tmp_path / "bad", ranks, groups)
    with pytest.raises(ConfigError, match=re.escape(message)) as err:
        run_traces(read_trace_set(folder), ExecConfig("fattree:n=2"))
    assert "\n" not in str(err.value)


def test_bad_files_are_one_line_errors(tmp_path):
    good = _write(tmp_path / "good", [[_coll(1)], [_coll(1)], [_coll(1)]])
    data = (good / "t.1.et").read_bytes()
    cases = {"truncated": data[:-3], "garbled": b"\x05\xff\xff\xff\xff\xff",
             "empty": b""}
    for name, content in cases.items():
        (good / "t.1.et").write_bytes(content)
        with pytest.raises(ConfigError, match=r"t\.1\.et") as err:
            read_trace_set(good)
        assert "\n" not in str(err.value), name
    (good / "t.1.et").unlink()
    with pytest.raises(ConfigError, match=r"lacks rank\(s\) \[1\]"):
        read_trace_set(good)
    with pytest.raises(ConfigError, match="no Chakra traces"):
        read_trace_set(tmp_path / "nowhere")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match="no Chakra traces"):
        read_trace_set(tmp_path / "empty")


def test_publish_leaves_nothing_on_failure(tmp_path):
    def fail(folder: Path) -> None:
        (folder / "half.et").write_bytes(b"\x01")
        raise ConfigError("stop")
    with pytest.raises(ConfigError, match="stop"):
        publish(tmp_path / "out", fail)
    assert list(tmp_path.iterdir()) == []
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("x")
    with pytest.raises(ConfigError, match="exists"):
        publish(tmp_path / "full", lambda folder: None)


# -- CLI -------------------------------------------------------------------------------
BERT = ["--workload", "bert-base", "--topology", "fattree:n=8,ports=1,rate=100",
        "--parallelism", "2x2x2", "--quiet"]


def test_cli_exports_and_imports(tmp_path, capsys):
    traces, out = tmp_path / "traces", tmp_path / "c.json"
    assert main(["simulate", *BERT, "--chakra", str(traces)]) == 0
    assert len(list(traces.glob("dlcomm.*.et"))) == 8
    assert main(["simulate", "chakra", str(traces), "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["kind"] == "simulate-chakra" and doc["summary"]["ranks"] == 8
    assert abs(doc["summary"]["recorded_error"]) < 1e-4
    assert "dlcomm's simulation of this iteration" in capsys.readouterr().out
    # a different topology, a prefix path, and an explicit algorithm
    assert main(["simulate", "chakra", str(traces / "dlcomm"), "--topology", "torus2d",
                 "--algorithm", "ring", "--quiet"]) == 0


def test_cli_several_runs_get_one_folder_each(tmp_path):
    traces = tmp_path / "many"
    assert main(["simulate", "--workload", "bert-base", "-n", "4", "--parallelism", "dp=4",
                 "--topology", "fattree,torus2d", "--exchange", "ring,switch", "--quiet",
                 "--chakra", str(traces)]) == 0
    assert sorted(p.name for p in traces.iterdir()) == [
        "00-fattree-ring-n4", "01-fattree-switch-n4", "02-torus2d-ring-n4"]


@pytest.mark.parametrize("args, message", [
    (["simulate", *BERT, "--chakra", "{full}"], "exists"),
    (["simulate", "chakra", "{empty}"], "no Chakra traces"),
    (["simulate", "chakra", "{bad}"], "truncated"),
    (["simulate", "chakra", "{astra}"], "--topology is required"),
])
def test_cli_errors_are_one_line_and_write_nothing(tmp_path, capsys, args, message):
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("x")
    (tmp_path / "empty").mkdir()
    _write(tmp_path / "bad", [[_coll(1)]])
    (tmp_path / "bad" / "t.0.et").write_bytes(b"\x0a\x00\x00")
    _write_astra(tmp_path / "astra", [[_allreduce_node()]])
    out = tmp_path / "x.json"
    args = [a.format(**{k: tmp_path / k for k in ("full", "empty", "bad", "astra")})
            for a in args]
    assert main([*args, "--json", str(out)]) != 0
    err = capsys.readouterr().err.strip()
    assert err.startswith("dlcomm: error:") and message in err and "\n" not in err
    assert not out.exists()


def test_export_refuses_what_it_does_not_model(tmp_path):
    cfg = SimConfig("bert-base", "fattree:n=4", 0, "dp=4", dilation=2.0)
    with pytest.raises(ConfigError, match="time dilation"):
        export_chakra(cfg, tmp_path)
