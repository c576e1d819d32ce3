"""msgspec schemas for typed decoding of Kineto / Chrome-trace JSON.

Only the fields the engine uses are declared; everything else is skipped by the decoder without
building Python objects, which is what makes loading fast.
"""

from __future__ import annotations

from typing import Any

import msgspec

Number = int | float
# args values are numbers in most traces, strings in some (e.g. vLLM/SGLang "bytes"): accept both.
Scalar = int | float | str
NAN = float("nan")


class RawArgs(msgspec.Struct, gc=False, frozen=True):
    """Defaults are sentinels (-1, NaN) so that columns convert to numpy without per-value checks.

    Frozen so that events without `args` (flows, most instant events) all share one default
    instance instead of allocating one each.
    """

    correlation: Scalar | None = -1
    stream: Number | str | None = -1
    device: Number | str | None = -1
    device_id: Scalar | None = msgspec.field(default=-1, name="Device Id")  # [memory] events
    external_id: Scalar | None = msgspec.field(default=-1, name="External id")
    external_id_2021: Scalar | None = msgspec.field(default=-1, name="external id")
    nbytes: Scalar | None = msgspec.field(default=NAN, name="bytes")
    mem_bytes: Scalar | None = msgspec.field(default=NAN, name="Bytes")
    total_allocated: Scalar | None = msgspec.field(default=NAN, name="Total Allocated")
    # Shapes and dtypes stay undecoded JSON text here (no lists built per event while decoding);
    # columns.py decodes each distinct text once.
    input_dims: msgspec.Raw = msgspec.field(default=None, name="Input Dims")
    input_type: msgspec.Raw = msgspec.field(default=None, name="Input type")
    call_stack: str | None = msgspec.field(default=None, name="Call stack")
    collective_name: str | None = msgspec.field(default=None, name="Collective name")
    in_msg_nelems: Scalar | None = msgspec.field(default=None, name="In msg nelems")
    out_msg_nelems: Scalar | None = msgspec.field(default=None, name="Out msg nelems")
    group_size: Scalar | None = msgspec.field(default=None, name="Group size")
    python_id: Scalar | None = msgspec.field(default=None, name="Python id")
    python_parent_id: Scalar | None = msgspec.field(default=None, name="Python parent id")
    name: Any = None  # process_name / thread_name metadata


NO_ARGS = RawArgs()


class RawEvent(msgspec.Struct, gc=False):
    ph: str = ""
    name: str = ""
    cat: str = ""
    ts: Number = 0
    dur: Number = 0
    pid: int | str = 0
    tid: int | str = 0
    args: RawArgs = NO_ARGS


class RawTrace(msgspec.Struct, gc=False):
    traceEvents: list[RawEvent]
    distributedInfo: dict[str, Any] | None = None
    deviceProperties: list[dict[str, Any]] | None = None
    schemaVersion: Any = None
    baseTimeNanoseconds: Number | None = None
    displayTimeUnit: str | None = None


TRACE_DECODER = msgspec.json.Decoder(RawTrace | list[RawEvent])
# Streaming load (job.py): the events array is decoded in slices, the other top-level keys apart.
EVENTS_DECODER = msgspec.json.Decoder(list[RawEvent])
TOP_DECODER = msgspec.json.Decoder(RawTrace)
