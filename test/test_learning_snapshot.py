"""Learner snapshots (no ROS): round trip for gmm, rbfn and gp; every refusal with its
reason (size, magic, truncated, header, format, trailing, checksum, kind, payload,
mismatch); files (atomic, a plain learner .npz read as version 0); and what the
OnlineResidual core gives the split: revision, snapshot, set_learner, hint."""
from __future__ import annotations

import hashlib
import json
import struct

import numpy as np
import pytest

from adaptive_dynamics.dynamics import RobotModel
from adaptive_dynamics.learning import Learner, OnlineResidual, make_learner
from adaptive_dynamics.learning.snapshot import (MAGIC, Snapshot, SnapshotError, decode_snapshot, encode_snapshot,
                                                 pack_snapshot, read_header, read_snapshot_file,
                                                 write_snapshot_file)

CONFIGS = {"gmm": {"max_components": 8}, "rbfn": {"n_basis": 32, "width": 0.5}, "gp": {"max_points": 60}}


def _data(n=200, d=6, o=2, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.uniform(-1, 1, (n, d))
    Y = np.c_[np.sin(X[:, 0]) + X[:, 1], np.cos(X[:, 2]) * X[:, 3]][:, :o]
    return X, Y


def _trained(kind):
    X, Y = _data()
    L = make_learner(kind, input_dim=6, output_dim=2, **CONFIGS[kind])
    L.partial_fit(X[:150], Y[:150])
    return L, X[150:]


def _rebuild(data: bytes, header_edit=None, payload=None) -> bytes:
    """Re-pack a snapshot with an edited header and/or payload (lengths kept consistent)."""
    header, body = read_header(data, max_bytes=None)
    header = dict(header)
    body = bytes(body) if payload is None else payload
    if header_edit:
        header_edit(header)
    raw = json.dumps(header).encode()
    return MAGIC + struct.pack("<I", len(raw)) + raw + body


@pytest.mark.parametrize("kind", sorted(CONFIGS))
def test_roundtrip(kind):
    L, Xq = _trained(kind)
    data = encode_snapshot(L, 7, source="host:/model_update", created=1234.5)
    assert data.startswith(MAGIC)
    snap = decode_snapshot(data, max_bytes=len(data))
    assert isinstance(snap, Snapshot)
    assert (snap.kind, snap.version, snap.input_dim, snap.output_dim) == (kind, 7, 6, 2)
    assert snap.source == "host:/model_update" and snap.created == 1234.5 and snap.nbytes == len(data)
    assert type(snap.learner) is type(L)
    # decoded learner: caches/factors rebuilt from the stored arrays, BLAS may sum in another order (~n eps)
    np.testing.assert_allclose(snap.learner.predict(Xq), L.predict(Xq), rtol=1e-9, atol=1e-12)
    # any buffer type: bytearray, memoryview, the uint8 array a ROS message carries
    import array
    for buf in (bytearray(data), memoryview(data), array.array("B", data)):
        assert decode_snapshot(buf, max_bytes=None).version == 7


def test_every_refusal_names_its_reason():
    L, _ = _trained("rbfn")
    data = encode_snapshot(L, 3)
    hlen = struct.unpack("<I", data[8:12])[0]

    def refused(buf, reason, match, max_bytes=None):
        with pytest.raises(SnapshotError, match=match) as err:
            decode_snapshot(buf, max_bytes=max_bytes)
        assert err.value.reason == reason and isinstance(err.value, ValueError)

    refused(data, "size", "over the 100 byte limit", max_bytes=100)
    refused(b"PK\x03\x04 not a snapshot", "magic", "bad magic")
    refused(b"\x89ADS", "truncated", "not even the magic")
    refused(b"", "truncated", "not even the magic")
    refused(data[:10], "truncated", "no header length")
    refused(data[:12 + hlen // 2], "truncated", "header of")
    refused(data[:-1], "truncated", "payload")
    refused(data[:len(data) // 2], "truncated", "payload")
    refused(data + b"\x00", "trailing", "1 bytes after")
    refused(data[:8] + struct.pack("<I", 10 ** 6) + data[12:], "header", "header length")
    refused(data[:12] + b"{" * hlen + data[12 + hlen:], "header", "not JSON")
    refused(_rebuild(data, lambda h: h.pop("sha256")), "header", "'sha256' missing")
    refused(_rebuild(data, lambda h: h.update(version="3")), "header", "'version'")
    refused(_rebuild(data, lambda h: h.update(version=-1)), "header", "negative")
    refused(_rebuild(data, lambda h: h.update(format=2)), "format", "unsupported snapshot format 2")
    flipped = bytearray(data)
    flipped[-30] ^= 0x01
    refused(bytes(flipped), "checksum", "checksum mismatch")
    refused(_rebuild(data, lambda h: h.update(kind="svm")), "kind", "unknown learner kind 'svm'")
    # a payload with a valid checksum that is not a learner, or another learner than the header says
    junk = b"PK\x03\x04" + b"\x00" * 64

    def with_payload(h, body):
        h.update(payload_bytes=len(body), sha256=hashlib.sha256(body).hexdigest())
    refused(_rebuild(data, lambda h: with_payload(h, junk), junk), "payload", "does not load")
    refused(_rebuild(data, lambda h: h.update(kind="gmm")), "mismatch", "holds 'rbfn'")
    refused(_rebuild(data, lambda h: h.update(input_dim=9)), "mismatch", "6 -> 2")
    refused(_rebuild(data, lambda h: h.update(output_dim=1)), "mismatch", "6 -> 2")
    assert decode_snapshot(data, max_bytes=len(data)).version == 3   # the original still decodes


def test_pack_refuses_negative_versions():
    with pytest.raises(ValueError, match=">= 0"):
        pack_snapshot(b"", kind="gmm", version=-1, input_dim=1, output_dim=1)


def test_files_are_atomic_and_npz_is_version_zero(tmp_path):
    L, Xq = _trained("gmm")
    path = tmp_path / "sub" / "model.snap"
    write_snapshot_file(path, encode_snapshot(L, 12))
    assert sorted(p.name for p in path.parent.iterdir()) == ["model.snap"]
    snap = read_snapshot_file(path)
    assert snap.version == 12 and snap.data == path.read_bytes()
    with pytest.raises(SnapshotError, match="model.snap: snapshot of") as err:
        read_snapshot_file(path, max_bytes=64)
    assert err.value.reason == "size"
    npz = L.save(tmp_path / "plain.npz")        # what residual_learner saves
    snap = read_snapshot_file(npz)
    assert snap.version == 0 and snap.kind == "gmm"
    np.testing.assert_allclose(snap.learner.predict(Xq), L.predict(Xq), rtol=1e-9, atol=1e-12)  # reloaded (~n eps)
    assert decode_snapshot(snap.data, max_bytes=None).version == 0   # re-encoded as a snapshot
    path.write_bytes(path.read_bytes()[:-5])
    with pytest.raises(SnapshotError, match="truncated"):
        read_snapshot_file(path)


@pytest.fixture(scope="module")
def model():
    return RobotModel("planar2")


def _stream(model, N=120, seed=1):
    rng = np.random.default_rng(seed)
    X = rng.uniform(-1, 1, (N, 3 * model.n))
    Y = np.c_[np.sin(X[:, 0]), X[:, 1] * X[:, 2]]
    return X, Y


def test_core_revision_snapshot_and_set_learner(model):
    core = OnlineResidual(model, "rbfn", {"n_basis": 32}, learn_every=1, warmup=40, block_size=20, threaded=False)
    assert core.snapshot(1) is None and core.revision == 0
    X, Y = _stream(model)
    for x, y in zip(X[:39], Y[:39]):
        core.add_sample(x, y)
    core.process()
    assert core.revision == 0                      # warm-up buffer only: no learner yet
    core.add_sample(X[39], Y[39])
    core.process()
    r1 = core.revision
    assert r1 > 0
    rev, data = core.snapshot(1, source="test")
    assert rev == r1
    snap = decode_snapshot(data, max_bytes=None)
    np.testing.assert_allclose(snap.learner.predict(X), core.predict(X), rtol=1e-9, atol=1e-12)  # decoded (~n eps)
    core.add_parameter_update(1e-3 * np.ones(model.n_params))
    core.process()
    assert core.revision == r1 + 1                 # a transform changes the learner
    core.add_parameter_update(np.zeros(model.n_params) * np.nan)   # rejected: no change
    assert core.revision == r1 + 1
    other = OnlineResidual(model, "rbfn", {"n_basis": 32}, threaded=False)
    other.set_learner(snap.learner, where="snapshot v1")
    assert other.revision == 1 and other.ready
    np.testing.assert_allclose(other.predict(X), snap.learner.predict(X), rtol=1e-12)
    with pytest.raises(ValueError, match="snapshot v1 holds a 'rbfn' learner"):
        OnlineResidual(model, "gmm", threaded=False).set_learner(snap.learner, where="snapshot v1")
    wrong = make_learner("rbfn", input_dim=4, output_dim=2, n_basis=8)
    with pytest.raises(ValueError, match="this robot needs"):
        other.set_learner(wrong)
    other.reset()
    assert other.revision == 2 and other.snapshot(3) is None


class _Recorder(Learner):
    """A learner that records its hints (registered under a private kind for this test)."""

    kind = "_hint_recorder"

    def __init__(self, input_dim, output_dim):
        super().__init__(input_dim, output_dim)
        self.hints = []

    def hint(self, x):
        self.hints.append(np.array(x))

    def _fit(self, X, y, R):
        pass

    def _predict(self, X, return_var):
        return np.zeros((len(X), self.output_dim)), None

    def get_config(self):
        return {"input_dim": self.input_dim, "output_dim": self.output_dim}


def test_core_hint_reaches_the_learner(model, monkeypatch):
    from adaptive_dynamics.learning import base
    monkeypatch.setitem(base.LEARNERS, _Recorder.kind, _Recorder)
    core = OnlineResidual(model, _Recorder.kind, learn_every=1, warmup=2, threaded=False)
    n3 = 3 * model.n
    assert not core.hint(np.full(n3, np.nan)) and not core.hint(np.zeros(n3 + 1))
    assert core.hint(np.arange(n3))              # before the learner exists: kept for it
    X, Y = _stream(model, N=3)
    core.add_sample(X[0], Y[0])
    core.add_sample(X[1], Y[1])
    core.process()
    assert core.ready and len(core.learner.hints) == 1
    np.testing.assert_array_equal(core.learner.hints[0], np.arange(n3))
    core.hint(np.ones(n3))
    np.testing.assert_array_equal(core.learner.hints[-1], np.ones(n3))


def test_epoch_in_the_header_and_the_order_of_snapshots():
    from adaptive_dynamics.learning.snapshot import newer
    L, _ = _trained("gmm")
    data = encode_snapshot(L, 4, epoch="a1b2", created=100.0)
    snap = decode_snapshot(data, max_bytes=None)
    assert snap.epoch == "a1b2" and read_header(data, max_bytes=None)[0]["epoch"] == "a1b2"
    # a header written before epochs existed still decodes, as epoch ""
    old = _rebuild(data, lambda h: h.pop("epoch"))
    assert "epoch" not in json.loads(old[12:12 + struct.unpack("<I", old[8:12])[0]])
    assert decode_snapshot(old, max_bytes=None).epoch == ""
    with pytest.raises(SnapshotError, match="'epoch'") as err:
        decode_snapshot(_rebuild(data, lambda h: h.update(epoch=7)), max_bytes=None)
    assert err.value.reason == "header"
    h = read_header(data, max_bytes=None)[0]
    # same epoch: by version only (created does not matter)
    assert newer(h, 3, "a1b2", 500.0)[0] and not newer(h, 4, "a1b2", 0.0)[0]
    assert not newer(h, 5, "a1b2", 0.0)[0]
    # another epoch (the trainer restarted): by creation time, whatever the versions
    assert newer(h, 10 ** 9, "ffff", 99.0)[0]
    ok, why = newer(h, 1, "ffff", 100.0)
    assert not ok and "epoch 'a1b2'" in why and "not after" in why
    assert newer(h, 4, "", 99.5)[0]                       # an old header's model: another epoch


def test_accept_runs_on_the_header_before_the_checksum_and_the_payload(monkeypatch):
    L, _ = _trained("rbfn")
    bad = bytearray(encode_snapshot(L, 2, epoch="e"))
    bad[-30] ^= 0x01                                       # a checksum that would fail
    seen = []

    def accept(header):
        seen.append(header["version"])
        raise SnapshotError("version", "not newer")
    loads = []
    monkeypatch.setattr(Learner, "from_bytes", classmethod(lambda cls, d: loads.append(1)))
    with pytest.raises(SnapshotError) as err:
        decode_snapshot(bytes(bad), max_bytes=None, accept=accept)
    assert err.value.reason == "version" and seen == [2] and not loads
    monkeypatch.undo()
    with pytest.raises(SnapshotError) as err:               # accepted header: the checksum runs next
        decode_snapshot(bytes(bad), max_bytes=None, accept=lambda h: None)
    assert err.value.reason == "checksum"
    good = encode_snapshot(L, 2)
    snap = decode_snapshot(good, max_bytes=None, accept=lambda h: None)
    assert snap.data is good                               # bytes are kept, not copied
    view = memoryview(good)
    assert decode_snapshot(view, max_bytes=None).data.obj is good      # a read-only view: not copied either


def _npz(members: dict, compression=None) -> bytes:
    import io
    import zipfile
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression or zipfile.ZIP_STORED) as zf:
        for name, raw in members.items():
            zf.writestr(name, raw)
    return buf.getvalue()


def _npy(arr) -> bytes:
    import io
    buf = io.BytesIO()
    np.save(buf, arr)
    return buf.getvalue()


def test_from_bytes_refuses_bombs_and_maps_every_failure_to_value_error():
    import io
    import zipfile
    L, Xq = _trained("gmm")
    data = L.to_bytes()
    with zipfile.ZipFile(io.BytesIO(data)) as zf:
        members = {i.filename: zf.read(i) for i in zf.infolist()}
        assert all(i.compress_type == zipfile.ZIP_STORED for i in zf.infolist())   # what np.savez writes
    np.testing.assert_allclose(Learner.from_bytes(_npz(members)).predict(Xq), L.predict(Xq))
    np.testing.assert_allclose(Learner.from_bytes(memoryview(data)).predict(Xq), L.predict(Xq))

    def refused(buf, match):
        with pytest.raises(ValueError, match=match) as err:
            Learner.from_bytes(buf)
        assert type(err.value) is ValueError and str(err.value).startswith("not a learner file")

    # a deflated member: 10 MB of zeros in a few kB
    bomb = dict(members, **{"a_zeros.npy": _npy(np.zeros(10 ** 6 // 8 * 10))})
    refused(_npz(bomb, zipfile.ZIP_DEFLATED), "compressed")
    # a member whose declared size is beyond the archive (central directory edited)
    raw = bytearray(_npz(members))
    cd = raw.rfind(b"PK\x01\x02")
    struct.pack_into("<I", raw, cd + 24, 10 ** 9)          # uncompressed size of the last member
    refused(bytes(raw), "bytes in an archive of")
    # an array header claiming far more data than its member holds
    header = _npy(np.zeros(4))
    huge = header.replace(b"(4,)", b"(10000000000,)".ljust(4))
    refused(_npz(dict(members, **{"a_big.npy": huge})), "claims")
    # malformed learners: the error types of the loader all become ValueError
    refused(_npz({"__meta__.npy": _npy(np.array("[]"))}), "AttributeError")
    meta = json.dumps({"kind": "gmm", "version": 1, "config": [1]})
    refused(_npz({"__meta__.npy": _npy(np.array(meta))}), "TypeError")
    refused(_npz({"x.npy": _npy(np.zeros(2))}), "KeyError")
    refused(b"PK\x03\x04" + b"\x00" * 64, "not a learner file")


def test_saves_are_durable(tmp_path, monkeypatch):
    """Both writers (Learner.save, write_snapshot_file) fsync the file before the rename
    and the directory after it."""
    import os
    from adaptive_dynamics import files
    events = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd):
        events.append(("fsync", os.path.isdir(f"/proc/self/fd/{fd}") if os.path.exists("/proc/self/fd") else None))
        return real_fsync(fd)

    def replace(a, b):
        events.append(("replace", os.path.basename(b)))
        return real_replace(a, b)
    monkeypatch.setattr(files.os, "fsync", fsync)
    monkeypatch.setattr(files.os, "replace", replace)
    L, _ = _trained("gmm")
    L.save(tmp_path / "m.npz")
    write_snapshot_file(tmp_path / "m.snap", encode_snapshot(L, 1))
    assert events == [("fsync", False), ("replace", "m.npz"), ("fsync", True),
                      ("fsync", False), ("replace", "m.snap"), ("fsync", True)]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.npz", "m.snap"]
