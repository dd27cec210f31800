"""Chakra execution traces (``.et``, ASTRA-sim's workload input): schema, files, trace sets.

1. **Schema.** Chakra's ``et_def.proto`` (proto3, package ``ChakraProtoMsg``; its content
   unchanged since Chakra's "Add version field", 2023-10) is built here at run time as a
   ``FileDescriptorProto`` in a private descriptor pool: no generated code, no protoc.
   ``GlobalMetadata.version`` is written "0.0.4", what ASTRA-sim's own generators stamp.
2. **A file** is a length-prefixed ``GlobalMetadata`` followed by length-prefixed ``Node``
   messages to the end of the file; each prefix a base-128 varint of at most 5 bytes (32
   bits), no header, no trailer. Gzip-compressed files (Chakra's Python tools accept them)
   are read, never written (ASTRA-sim's current feeder cannot read them).
3. **A trace set** is ``<prefix>.<rank>.et`` for ranks 0..N-1 plus ASTRA-sim's
   communicator groups, ``{"<id>": [ranks]}`` (``--comm-group-configuration``; ids >= 1:
   ASTRA-sim asserts it, and pg_name "" or "0" means all ranks).
4. **Attributes** are written with the oneof types Chakra's own writers use and ASTRA-sim
   reads (``ATTR_TYPES``), and always with their value set, 0 and false included: the
   feeder keys on the attribute being present with a value case.

Writing goes to a temporary folder renamed into place (:func:`publish`): nothing
half-written. Every bad input is one :class:`dlcomm.errors.ConfigError` line.
"""

from __future__ import annotations

import gzip
import json
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

from dlcomm.errors import ConfigError

__all__ = ["NODE_TYPES", "COMM_TYPES", "ATTR_TYPES", "VERSION", "TraceNode", "TraceSet",
           "schema", "encode_varint", "frame", "unframe", "node_message", "write_trace_set",
           "read_trace_set", "check_folder", "publish"]

VERSION = "0.0.4"
NODE_TYPES = ("INVALID_NODE", "METADATA_NODE", "MEM_LOAD_NODE", "MEM_STORE_NODE",
              "COMP_NODE", "COMM_SEND_NODE", "COMM_RECV_NODE", "COMM_COLL_NODE")
COMM_TYPES = ("ALL_REDUCE", "REDUCE", "ALL_GATHER", "GATHER", "SCATTER", "BROADCAST",
              "ALL_TO_ALL", "REDUCE_SCATTER", "REDUCE_SCATTER_BLOCK", "BARRIER")
# the oneof case of each attribute ASTRA-sim reads; others by Python type (_case)
ATTR_TYPES = {"is_cpu_op": "bool_val", "num_ops": "int64_val", "tensor_size": "uint64_val",
              "comm_type": "int64_val", "comm_size": "int64_val", "comm_priority": "int32_val",
              "comm_src": "int32_val", "comm_dst": "int32_val", "comm_tag": "int32_val",
              "pg_name": "string_val", "involved_dim": "bool_list"}
# the oneof ``value`` of AttributeProto: <scalar>_val = 3 + 2k, <scalar>_list = 4 + 2k
_SCALARS = ("double", "float", "int32", "int64", "uint32", "uint64", "sint32", "sint64",
            "fixed32", "fixed64", "sfixed32", "sfixed64", "bool", "string", "bytes")
_FILE = re.compile(r"^(?P<prefix>.+)\.(?P<rank>\d+)\.et$")


@dataclass(frozen=True)
class TraceNode:
    """One node of a rank's trace; ``attrs`` by name (the first of a name, as the feeder)."""

    id: int
    name: str
    type: int                                   # NodeType number (NODE_TYPES)
    data_deps: tuple[int, ...] = ()
    ctrl_deps: tuple[int, ...] = ()
    duration_micros: int = 0
    attrs: dict[str, Any] = field(default_factory=dict, hash=False)


@dataclass
class TraceSet:
    ranks: list[list[TraceNode]]                # nodes of rank r, in file order
    groups: dict[str, list[int]]                # communicator group id -> ranks
    metadata: dict[str, Any] = field(default_factory=dict)   # rank 0's GlobalMetadata


@cache
def schema() -> dict[str, Any]:
    """The message classes of ``et_def.proto`` by name (``Node``, ``GlobalMetadata``, ...)."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    fd = descriptor_pb2.FieldDescriptorProto
    types = {"double": fd.TYPE_DOUBLE, "float": fd.TYPE_FLOAT, "int32": fd.TYPE_INT32,
             "int64": fd.TYPE_INT64, "uint32": fd.TYPE_UINT32, "uint64": fd.TYPE_UINT64,
             "sint32": fd.TYPE_SINT32, "sint64": fd.TYPE_SINT64, "fixed32": fd.TYPE_FIXED32,
             "fixed64": fd.TYPE_FIXED64, "sfixed32": fd.TYPE_SFIXED32,
             "sfixed64": fd.TYPE_SFIXED64, "bool": fd.TYPE_BOOL, "string": fd.TYPE_STRING,
             "bytes": fd.TYPE_BYTES}
    proto = descriptor_pb2.FileDescriptorProto(name="et_def.proto", package="ChakraProtoMsg",
                                               syntax="proto3")

    def message(name: str, fields: list[tuple[str, int, str, bool]],
                oneof: Collection[str] = ()) -> None:
        msg = proto.message_type.add(name=name)
        if oneof:
            msg.oneof_decl.add(name="value")
        for fname, number, kind, repeated in fields:
            f = msg.field.add(name=fname, number=number, label=fd.LABEL_REPEATED if repeated
                              else fd.LABEL_OPTIONAL)
            if kind in types:
                f.type = types[kind]
            else:
                f.type = fd.TYPE_ENUM if kind.endswith("Type") else fd.TYPE_MESSAGE
                f.type_name = f".ChakraProtoMsg.{kind}"
            if fname in oneof:
                f.oneof_index = 0

    lists = {s: s.capitalize() + "List" for s in _SCALARS}
    attr_fields = [("name", 1, "string", False), ("doc_string", 2, "string", False)]
    for k, s in enumerate(_SCALARS):
        attr_fields += [(f"{s}_val", 3 + 2 * k, s, False), (f"{s}_list", 4 + 2 * k, lists[s],
                                                              False)]
    message("AttributeProto", attr_fields, {f[0] for f in attr_fields[2:]})
    for s in _SCALARS:
        message(lists[s], [("values", 1, s, True)])
    message("GlobalMetadata", [("version", 1, "string", False),
                               ("attr", 2, "AttributeProto", True)])
    for name, values in (("NodeType", NODE_TYPES), ("CollectiveCommType", COMM_TYPES)):
        enum = proto.enum_type.add(name=name)
        for number, value in enumerate(values):
            enum.value.add(name=value, number=number)
    message("Node", [("id", 1, "uint64", False), ("name", 2, "string", False),
                     ("type", 3, "NodeType", False), ("ctrl_deps", 4, "uint64", True),
                     ("data_deps", 5, "uint64", True), ("start_time_micros", 6, "uint64", False),
                     ("duration_micros", 7, "uint64", False), ("inputs", 8, "IOInfo", False),
                     ("outputs", 9, "IOInfo", False), ("attr", 10, "AttributeProto", True)])
    message("IOInfo", [("values", 1, "string", False), ("shapes", 2, "string", False),
                       ("types", 3, "string", False)])
    message("Tensor", [(n, i + 1, "uint64", False) for i, n in enumerate(
        ("tensor_id", "storage_id", "offset", "num_elem", "elem_bytes"))]
            + [("device", 6, "string", False)])
    pool = descriptor_pool.DescriptorPool()
    pool.Add(proto)
    return {m.name: message_factory.GetMessageClass(
        pool.FindMessageTypeByName(f"ChakraProtoMsg.{m.name}")) for m in proto.message_type}


# -- framing ---------------------------------------------------------------------------
def encode_varint(n: int) -> bytes:
    """Base-128 varint: 7 bits per byte, least significant group first, MSB = more."""
    out = bytearray()
    while True:
        low, n = n & 0x7F, n >> 7
        out.append(low | (0x80 if n else 0))
        if not n:
            return bytes(out)


def frame(messages: list[bytes]) -> bytes:
    """Each message behind its length as a varint (Chakra's ``encodeMessage``)."""
    return b"".join(encode_varint(len(m)) + m for m in messages)


def unframe(data: bytes, where: str = "trace") -> list[bytes]:
    """The messages of a framed stream; a prefix over 5 bytes or a cut message is an error."""
    out: list[bytes] = []
    pos = 0
    while pos < len(data):
        size, shift, start = 0, 0, pos
        while True:
            if pos == len(data):
                raise ConfigError(f"{where}: truncated length prefix at byte {start}")
            byte = data[pos]
            pos += 1
            size |= (byte & 0x7F) << shift
            if not byte & 0x80:
                break
            shift += 7
            if shift > 28:
                raise ConfigError(f"{where}: length prefix at byte {start} exceeds 32 bits "
                                  "(not a Chakra trace?)")
        if pos + size > len(data):
            raise ConfigError(f"{where}: message {len(out)} at byte {start} needs {size} "
                              f"bytes, {len(data) - pos} left (truncated file)")
        out.append(data[pos:pos + size])
        pos += size
    return out


# -- nodes and attributes --------------------------------------------------------------
def _case(name: str, value: Any) -> str:
    if name in ATTR_TYPES:
        return ATTR_TYPES[name]
    if isinstance(value, bool):
        return "bool_val"
    if isinstance(value, int):
        return "int64_val"
    return "double_val" if isinstance(value, float) else "string_val"


def _set_attrs(repeated: Any, attrs: dict[str, Any]) -> None:
    for name, value in attrs.items():
        attr = repeated.add(name=name)
        case = _case(name, value)
        if case.endswith("_list"):
            getattr(attr, case).values.extend(value)
        else:
            setattr(attr, case, value)


def _get_attrs(repeated: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for attr in repeated:
        case = attr.WhichOneof("value")
        value: Any = None
        if case is not None:
            value = getattr(attr, case)
            value = list(value.values) if case.endswith("_list") else value
        out.setdefault(attr.name, value)
    return out


def node_message(node: TraceNode) -> Any:
    """``node`` as a ``ChakraProtoMsg.Node``."""
    msg = schema()["Node"](id=node.id, name=node.name, type=node.type,
                           data_deps=node.data_deps, ctrl_deps=node.ctrl_deps,
                           duration_micros=node.duration_micros)
    _set_attrs(msg.attr, node.attrs)
    return msg


def _metadata(attrs: dict[str, Any]) -> bytes:
    msg = schema()["GlobalMetadata"](version=VERSION)
    _set_attrs(msg.attr, attrs)
    return bytes(msg.SerializeToString())


def _read_file(path: Path) -> tuple[dict[str, Any], list[TraceNode]]:
    from google.protobuf.message import DecodeError

    try:
        data = path.read_bytes()
        if data[:2] == b"\x1f\x8b":
            data = gzip.decompress(data)
    except (OSError, EOFError) as exc:
        raise ConfigError(f"Chakra trace {path}: {getattr(exc, 'strerror', None) or exc}") \
            from exc
    messages = unframe(data, str(path))
    if not messages:
        raise ConfigError(f"Chakra trace {path} is empty (no GlobalMetadata)")
    classes = schema()
    meta: dict[str, Any] = {}
    nodes = []
    for i, raw in enumerate(messages):
        msg = classes["GlobalMetadata" if i == 0 else "Node"]()
        try:
            msg.ParseFromString(raw)
        except DecodeError as exc:
            what = "GlobalMetadata" if i == 0 else f"node message {i}"
            raise ConfigError(f"Chakra trace {path}: {what} does not parse ({exc})") from exc
        if i == 0:
            meta = {"version": msg.version, **_get_attrs(msg.attr)}
            continue
        nodes.append(TraceNode(msg.id, msg.name, msg.type, tuple(msg.data_deps),
                               tuple(msg.ctrl_deps), msg.duration_micros, _get_attrs(msg.attr)))
    return meta, nodes


# -- trace sets ------------------------------------------------------------------------
def write_trace_set(folder: Path, traces: TraceSet, prefix: str = "dlcomm") -> list[Path]:
    """Write ``<prefix>.<rank>.et`` and ``comm_group.json`` into the existing ``folder``."""
    paths = []
    for rank, nodes in enumerate(traces.ranks):
        path = folder / f"{prefix}.{rank}.et"
        body = [_metadata(traces.metadata)] + [bytes(node_message(n).SerializeToString())
                                               for n in nodes]
        path.write_bytes(frame(body))
        paths.append(path)
    groups = folder / "comm_group.json"
    groups.write_text(json.dumps(traces.groups, indent=1) + "\n")
    return [*paths, groups]


def _trace_files(path: Path) -> tuple[Path, dict[int, Path]]:
    """The folder and rank files of a trace set given as a folder or a path prefix."""
    folder, want = (path, None) if path.is_dir() else (path.parent, path.name)
    if not folder.is_dir():
        raise ConfigError(f"no Chakra traces at {path}: no such folder")
    found: dict[str, dict[int, Path]] = {}
    for p in folder.iterdir():
        m = _FILE.match(p.name)
        if m and (want is None or m["prefix"] == want):
            found.setdefault(m["prefix"], {})[int(m["rank"])] = p
    if not found:
        raise ConfigError(f"no Chakra traces (<prefix>.<rank>.et) at {path}")
    if len(found) > 1:
        raise ConfigError(f"{folder} holds several trace sets ({', '.join(sorted(found))}): "
                          "give the path prefix, e.g. " + str(folder / sorted(found)[0]))
    files = next(iter(found.values()))
    missing = sorted(set(range(max(files) + 1)) - set(files))
    if missing:
        raise ConfigError(f"Chakra trace set at {path} lacks rank(s) {missing[:8]} "
                          f"of 0..{max(files)}")
    return folder, files


def _read_groups(path: Path, ranks: int) -> dict[str, list[int]]:
    try:
        doc = json.loads(path.read_text())
    except OSError as exc:
        raise ConfigError(f"communicator groups {path}: {exc.strerror}") from exc
    except ValueError as exc:
        raise ConfigError(f"communicator groups {path} are not JSON ({exc})") from exc
    if not isinstance(doc, dict):
        raise ConfigError(f"communicator groups {path}: expected {{\"<id>\": [ranks]}}")
    for key, members in doc.items():
        if not key.isdigit() or int(key) < 1:
            raise ConfigError(f"communicator groups {path}: group id {key!r} is not an "
                              "integer >= 1 (ASTRA-sim asserts ids > 0)")
        if not (isinstance(members, list) and members and all(
                type(r) is int and 0 <= r < ranks for r in members)):
            raise ConfigError(f"communicator groups {path}: group {key} must list ranks "
                              f"0..{ranks - 1}")
        if len(set(members)) != len(members):
            raise ConfigError(f"communicator groups {path}: group {key} lists a rank twice")
    return {str(int(k)): list(v) for k, v in doc.items()}


def read_trace_set(path: str | Path, comm_groups: str | Path | None = None) -> TraceSet:
    """Read a trace set (a folder, or a path prefix as ASTRA-sim's --workload-configuration
    takes it) and its communicator groups (``comm_groups``, else ``comm_group.json`` beside
    the traces if there is one)."""
    folder, files = _trace_files(Path(path))
    ranks: list[list[TraceNode]] = []
    meta: dict[str, Any] = {}
    for rank in range(len(files)):
        m, nodes = _read_file(files[rank])
        ranks.append(nodes)
        meta = meta or m
    groups_path = Path(comm_groups) if comm_groups else folder / "comm_group.json"
    groups = _read_groups(groups_path, len(ranks)) if comm_groups or groups_path.exists() \
        else {}
    return TraceSet(ranks, groups, meta)


def check_folder(target: str | Path) -> Path:
    """Fail early unless ``target`` can become a new folder of traces."""
    target = Path(target)
    if target.exists() and not (target.is_dir() and not any(target.iterdir())):
        raise ConfigError(f"{target} exists: give a new (or empty) folder for the traces")
    if not target.parent.is_dir():
        raise ConfigError(f"{target}: folder {target.parent} does not exist")
    return target


def publish(target: str | Path, fill: Callable[[Path], Any]) -> Path:
    """Call ``fill(tmp)`` on a new temporary folder beside ``target``, then rename it to
    ``target`` (which must not exist, or be an empty folder); no partial folder on failure."""
    target = check_folder(target)
    parent = target.parent
    try:
        tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=parent))
    except OSError as exc:
        raise ConfigError(f"{target} is not writable: {exc.strerror}") from exc
    try:
        fill(tmp)
        os.chmod(tmp, 0o755)
        if target.exists():
            target.rmdir()
        os.replace(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return target
