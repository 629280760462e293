"""Read back what a training's loggers wrote, with each logger's own format: TensorBoard's event
files through TensorBoard's reader, a W&B offline run's record log through W&B's protobuf
messages. The integration tests use them to check the probe's figures reached those files."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any


def tb_scalars(logdir: Path) -> dict[str, list[float]]:
    """Every scalar under logdir (each folder holding event files), by tag, in step order.
    Keras/TF write scalars as tensor summaries; PyTorch's SummaryWriter as simple values: both
    are read."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out: dict[str, list[float]] = {}
    folders = sorted({p.parent for p in logdir.rglob("events.out.tfevents.*")})
    for folder in folders:
        acc = EventAccumulator(str(folder), size_guidance={"scalars": 0, "tensors": 0})
        acc.Reload()
        tags = acc.Tags()
        for tag in tags.get("scalars", []):
            out.setdefault(tag, []).extend(e.value for e in acc.Scalars(tag))
        for tag in tags.get("tensors", []):
            from tensorboard.util import tensor_util

            for e in acc.Tensors(tag):
                value = tensor_util.make_ndarray(e.tensor_proto)
                if value.shape == () and value.dtype.kind in "fiu":  # not text (a model's graph)
                    out.setdefault(tag, []).append(float(value))
    return out


# the record log of a .wandb file: a 7-byte header (":W&B", magic 0xBEE1, version 0), then 32 KiB
# blocks of chunks, each with a 7-byte header (checksum u32, length u16, type u8: 1 a whole record,
# 2/3/4 its first/middle/last part), as in LevelDB's log format
_BLOCK = 32768
_FULL, _FIRST, _MIDDLE, _LAST = 1, 2, 3, 4


def _wandb_records(data: bytes) -> list[bytes]:
    assert data[:4] == b":W&B", data[:7]
    records: list[bytes] = []
    pos, pending = 7, b""
    while pos + 7 <= len(data):
        left_in_block = _BLOCK - pos % _BLOCK
        if left_in_block < 7:  # the block's tail is padding
            pos += left_in_block
            continue
        _crc, length, kind = struct.unpack_from("<IHB", data, pos)
        chunk = data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind == _FULL:
            records.append(chunk)
        elif kind == _FIRST:
            pending = chunk
        elif kind == _MIDDLE:
            pending += chunk
        elif kind == _LAST:
            records.append(pending + chunk)
        elif kind == 0 and length == 0:  # zero padding
            continue
    return records


def wandb_history(wandb_dir: Path) -> list[dict[str, Any]]:
    """The `history` rows (what wandb.log was given) of every offline run under wandb_dir."""
    from wandb.proto import wandb_internal_pb2 as pb

    rows: list[dict[str, Any]] = []
    for f in sorted(wandb_dir.rglob("offline-run-*/run-*.wandb")):
        for raw in _wandb_records(f.read_bytes()):
            rec = pb.Record()
            rec.ParseFromString(raw)
            if rec.WhichOneof("record_type") == "history":
                rows.append(
                    {
                        item.key or "/".join(item.nested_key): json.loads(item.value_json)
                        for item in rec.history.item
                    }
                )
    return rows
