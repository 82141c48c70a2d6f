#!/usr/bin/env python3
"""Writes the generated seeds of the fuzz corpora (README.md here): valid data-plane messages
(wire_header, bundle) built with WireHeader's layout (dataplane/collectives/wire.h), and job
plans (plan_view) encoded by protoc from the text plans in plan_view_text/. The topology
corpora are the fixtures and the parser tests' own inputs, copied as they are."""
import os
import struct
import subprocess

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", "..", ".."))
# WireHeader, packed, little-endian: magic version kind dtype reduce algorithm reserved0[3]
# sender_instance (together the 7s below: zero, an unstamped sender) job tensor iteration plan_version tensor_count world_size sender root step num_chunks chunk
# chunk_offset chunk_count error_code reserved1 mac[16] (the job MAC; zero: the fuzz targets
# parse headers, they do not authenticate them).
WIRE = struct.Struct("<IBBBBB7sQQQQQIIIIIIQQII16s")
assert WIRE.size == 120
PUSH, RESULT, ERROR, DATA, ABORT, PULL = 1, 2, 3, 4, 5, 6
PEER_QUERY, PEER_ANSWER, PEER_FETCH = 7, 8, 9
PUSH_PULL, RING, HD, PS = 1, 2, 3, 4
F32, F64, F16, BF16, I32, I64 = 1, 2, 3, 4, 5, 6
SIZE = {F32: 4, F64: 8, F16: 2, BF16: 2, I32: 4, I64: 8}
SUM, AVG, BCAST, ALLGATHER, RS_SUM = 1, 2, 3, 4, 5
PS_INIT, PS_DELTA, PS_PULL = 7, 8, 9


def chunk(count, chunks, index):
    return count * index // chunks, count * (index + 1) // chunks - count * index // chunks


def header(kind, algo, dtype=F32, reduce=SUM, count=1000, chunks=4, index=1, world=4,
           sender=1, root=0, error=0, step=0):
    off, n = chunk(count, chunks, index)
    if kind in (ERROR, ABORT):
        n = off = 0
    h = WIRE.pack(0x42495254, 3, kind, dtype, reduce, algo, bytes(7), 0x1234, 0x5678, 3, 7,
                  count, world, sender, root, step, chunks, index, off, n, error, 0, bytes(16))
    payload = b"" if kind in (ERROR, ABORT) else bytes(range(256)) * (n * SIZE[dtype] // 256 + 1)
    payload = payload[: n * SIZE[dtype]] if kind not in (ERROR, ABORT) else b"peer gave up"
    return h, payload


def messages():
    yield "push_f32", header(PUSH, PUSH_PULL)
    yield "result_f64", header(RESULT, PUSH_PULL, dtype=F64, sender=0xFFFFFFFF)
    yield "push_bcast_nonroot", (header(PUSH, PUSH_PULL, reduce=BCAST, root=0)[0], b"")
    yield "data_ring_f16", header(DATA, RING, dtype=F16, count=64, chunks=2, index=0)
    yield "data_hd_allgather", header(DATA, HD, dtype=I64, reduce=ALLGATHER, count=24, chunks=3)
    yield "data_ring_rs", header(DATA, RING, dtype=BF16, reduce=RS_SUM, count=16, chunks=1,
                                 index=0)
    yield "error_push_pull", header(ERROR, PUSH_PULL, error=3, sender=0xFFFFFFFF)
    yield "abort_ring", header(ABORT, RING, error=10)
    # Parameter server (root = the worker's global rank; a delta's clock in step).
    yield "ps_delta", header(PUSH, PS, reduce=PS_DELTA, sender=2, root=2, step=3)
    yield "ps_pull", (header(PULL, PS, reduce=PS_PULL, sender=2, root=2)[0], b"")
    h, p = header(RESULT, PS, reduce=PS_PULL, sender=0xFFFFFFFF, root=2)
    yield "ps_values", (h, struct.pack("<Q", 5) + p)
    # Push/pull peer recovery: a question, a no, a fetch of chunks 0 and 3, a peer's sum.
    yield "peer_query", (header(PEER_QUERY, PUSH_PULL, index=0)[0], b"")
    yield "peer_answer_no", (header(PEER_ANSWER, PUSH_PULL, error=5)[0], b"")
    yield "peer_fetch", (header(PEER_FETCH, PUSH_PULL, index=0)[0], struct.pack("<II", 0, 3))
    yield "peer_result", header(RESULT, PUSH_PULL, sender=2)


def pad8(b):
    return b + b"\0" * (-len(b) % 8)


def bundle(records):
    body = b"".join(struct.pack("<II", len(h), len(p)) + pad8(h) + pad8(p) for h, p in records)
    return struct.pack("<IIII", 0x4E425254, 1, len(records), 0), body


def framed(h, p):
    # The fuzz targets' input: one byte choosing the header length, the header, the payload.
    return bytes([len(h)]) + h + p


def write(target, name, data):
    os.makedirs(os.path.join(HERE, target), exist_ok=True)
    with open(os.path.join(HERE, target, name), "wb") as f:
        f.write(data)


def main():
    msgs = list(messages())
    for name, (h, p) in msgs:
        write("wire_header", name, framed(h, p))
        write("bundle", "single_" + name, framed(h, p))
    write("bundle", "bundle_all", framed(*bundle([m for _, m in msgs])))
    write("bundle", "bundle_two", framed(*bundle([msgs[0][1], msgs[3][1]])))
    write("bundle", "bundle_empty_record", framed(*bundle([(b"", b"")])))
    text_dir = os.path.join(HERE, "plan_view_text")
    proto_dir = os.path.join(ROOT, "api")
    for name in sorted(os.listdir(text_dir)):
        with open(os.path.join(text_dir, name), "rb") as f:
            encoded = subprocess.run(
                ["protoc", "-I" + proto_dir, "--encode=tributary.v1.JobPlan",
                 "tributary/v1/controller.proto"], input=f.read(), check=True,
                capture_output=True).stdout
        write("plan_view", os.path.splitext(name)[0], encoded)


if __name__ == "__main__":
    main()
