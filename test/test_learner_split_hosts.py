"""The prediction / model-update split across two hosts, emulated by two network
namespaces joined by a veth pair (nothing leaves the machine).

``model_update`` runs in one namespace, fed by a peer process there
(``split_hosts_peer.py learn``: joint states with torques and the reference at
200 Hz); ``prediction`` runs in the other with the "robot" (``split_hosts_peer.py
robot``: the reference and joint states at ``CONTROL_HZ``, recording ``feedforward/residual``
and ``/diagnostics``).  DDS discovers over the link only
(``ROS_AUTOMATIC_DISCOVERY_RANGE=SUBNET`` in the namespaces, UDPv4 alone so every
snapshot byte crosses the veth, a domain of its own).  In one run:

1. link up: model versions cross it and are applied; a residual for every control
   period (1 ms);
2. link down (both ends) for 3 s: prediction keeps publishing at the control rate on
   the last model (no stamp missing, no output held), its diagnostics show no new
   version and ``model_received_s_ago`` growing; ``model_update``'s diagnostics stop
   arriving, its versions go on;
3. link up again: newer versions arrive and are applied; over the whole run every
   applied version is strictly greater than the one before (``versions_applied``), and
   nothing but older/equal versions is refused;
4. link rate-limited (``tc qdisc ... tbf``, 0.5 Mbit/s): a snapshot (~25 kB) takes ~340
   control periods to cross, longer than ``publish_period``; prediction keeps its rate
   while one is in flight, and the snapshots still arrive and are applied (model_update
   waits for the readers' acknowledgement before the next; without that each new one
   replaced the one in flight and none arrived).

"A residual for every period": every reference stamp gets one (``prediction_lead``
50 ms), within a few per cent of the states sent, no wall gap over 250 ms; instants
skipped while the robot process itself was starved by the host are reported, not
counted against the node (:meth:`Record.stream`).

The publish -> receipt and publish -> apply latencies of the applied versions (from
the prediction node's ``model_age_s - model_received_s_ago`` and ``load_ms_last``) are
printed for the free and the rate-limited link, with the residual stream's figures.

Needs root (``ip netns add``); otherwise skipped with that reason.
"""
from __future__ import annotations

import fcntl
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Optional

import pytest

from adaptive_dynamics.scenarios import NodeSpec
from adaptive_dynamics.launcher import command_line

HERE = Path(__file__).resolve().parent
PEER = str(HERE / "split_hosts_peer.py")
NAMES = "joint1,joint2"
#: the robot peer's rate: what this test checks -- no instant skipped, the outage, the rate
#: limit, the snapshots -- holds at any control rate, and four 1 kHz processes on a slow
#: 2-vCPU host (where even the prediction node before the fall-back kept 300 of 1000
#: residuals a second) made it a measure of the host; the 1 kHz budget is bench/loop.py's
CONTROL_HZ = 250.0
LEARN_HZ = 200.0
PUBLISH_PERIOD = 0.25          # s between snapshots at most
OUTAGE = 3.0                   # s the link is down
TBF_RATE = 500_000             # bit/s of the rate-limited link: a snapshot takes longer than PUBLISH_PERIOD
TBF_BURST = 4096               # bytes the bucket lets through at once
PHASE = 2.0                    # s at least with the link up, up again and rate-limited
SNAPSHOT_FLOOR = 10_000        # bytes: a snapshot at least this large takes > 40 ms at TBF_RATE
LEAD = 0.05                    # s: prediction_lead (a stall shorter than this skips no residual)
MAX_GAP_MS = 250.0             # longest wall gap between two residuals tolerated (a loaded 2-core host)


def namespace_support() -> Optional[str]:
    """None if this process can create network namespaces, else why not (the skip
    reason)."""
    if not sys.platform.startswith("linux"):
        return "network namespaces need Linux"
    if os.geteuid() != 0:
        return "creating network namespaces (ip netns add) needs root; CI runs as root"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"iproute2's {tool!r} is not installed"
    return None


def _run(*cmd: str, check: bool = True) -> subprocess.CompletedProcess:
    res = subprocess.run(list(cmd), capture_output=True, text=True, timeout=20)
    if check and res.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: {res.stderr.strip() or res.returncode}")
    return res


class Link:
    """Two network namespaces (``ad_mu_<pid>``: model update, ``ad_pr_<pid>``:
    prediction) joined by a veth pair, 10.231.0.1/30 <-> 10.231.0.2/30, loopback up in
    each.  :meth:`close` deletes both (with them the veth and any qdisc)."""

    def __init__(self, tag: str):
        self.ns = {"mu": f"ad_mu_{tag}", "pr": f"ad_pr_{tag}"}
        self.dev = {"mu": f"admu{tag}"[:15], "pr": f"adpr{tag}"[:15]}
        self.addr = {"mu": "10.231.0.1", "pr": "10.231.0.2"}
        self.made: list[str] = []

    def create(self) -> None:
        """The namespaces and the veth pair (RuntimeError naming the failed command),
        then addresses and links up, waiting until both ends run."""
        for side in ("mu", "pr"):
            _run("ip", "netns", "add", self.ns[side])
            self.made.append(self.ns[side])
        _run("ip", "link", "add", self.dev["mu"], "netns", self.ns["mu"], "type", "veth",
             "peer", "name", self.dev["pr"], "netns", self.ns["pr"])

    def configure(self) -> None:
        for side in ("mu", "pr"):
            ns, dev = self.ns[side], self.dev[side]
            _run("ip", "-n", ns, "link", "set", "lo", "up")
            _run("ip", "-n", ns, "addr", "add", f"{self.addr[side]}/30", "dev", dev)
            _run("ip", "-n", ns, "link", "set", dev, "multicast", "on", "up")
        self.wait_running()

    def running(self) -> bool:
        """Both ends operationally up (carrier: IFF_RUNNING)."""
        for side in ("mu", "pr"):
            out = _run("ip", "-n", self.ns[side], "-j", "link", "show", "dev", self.dev[side], check=False).stdout
            try:
                if json.loads(out)[0].get("operstate") != "UP":
                    return False
            except (ValueError, IndexError):
                return False
        return True

    def wait_running(self, timeout: float = 10.0) -> None:
        """The kernel reports a veth's carrier up to a second after ``ip link set up``
        (linkwatch); a DDS participant created before that sees no address but loopback
        and announces 127.0.0.1 alone, unreachable from the other namespace for good."""
        deadline = time.monotonic() + timeout
        while not self.running():
            if time.monotonic() > deadline:
                raise RuntimeError(f"veth {self.dev} not running after {timeout} s")
            time.sleep(0.05)

    def set(self, state: str) -> None:
        """Both ends ``up`` or ``down`` (as a cable pulled: each host sees its interface go)."""
        for side in ("mu", "pr"):
            _run("ip", "-n", self.ns[side], "link", "set", self.dev[side], state)
        if state == "up":
            self.wait_running()

    def limit(self, rate_bit: int) -> None:
        """tbf on the model-update side's egress (the snapshots' direction).  The queue
        holds a second of traffic, so a snapshot's IP fragments are delayed, never
        dropped (one lost fragment would lose the whole datagram)."""
        _run("tc", "-n", self.ns["mu"], "qdisc", "add", "dev", self.dev["mu"], "root", "tbf",
             "rate", f"{rate_bit}bit", "burst", str(TBF_BURST), "latency", "1s")

    def unlimit(self) -> None:
        _run("tc", "-n", self.ns["mu"], "qdisc", "del", "dev", self.dev["mu"], "root", check=False)

    def qdisc_stats(self) -> str:
        return _run("tc", "-n", self.ns["mu"], "-s", "qdisc", "show", "dev", self.dev["mu"], check=False).stdout

    def close(self) -> None:
        self.unlimit()
        for ns in self.made:
            _run("ip", "netns", "del", ns, check=False)
        self.made.clear()


def reserve_domain(exclude: set[int]):
    """A ROS_DOMAIN_ID in 1..232 other than ``exclude``, reserved with ``./dev``'s lock
    files (``/tmp/adaptive_dynamics_domain_<id>.lock``) while the returned file stays
    open."""
    ids = [i for i in range(1, 233) if i not in exclude]
    random.shuffle(ids)
    for i in ids:
        fh = open(f"/tmp/adaptive_dynamics_domain_{i}.lock", "a")
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return i, fh
        except OSError:
            fh.close()
    raise RuntimeError("no free ROS_DOMAIN_ID in 1..232")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:   # alive, someone else's
        pass
    return True


def remove_stale_namespaces() -> None:
    """Namespaces of this test whose process is gone (a run killed before its teardown),
    or named after this process (its pid reused)."""
    for line in _run("ip", "netns", "list", check=False).stdout.splitlines():
        m = re.match(r"ad_(mu|pr)_(\d+)\b", line)
        if m and (int(m.group(2)) == os.getpid() or not _alive(int(m.group(2)))):
            _run("ip", "netns", "del", m.group(0), check=False)


def open_link(tag: str) -> Link:
    """The two namespaces and their link, or a pytest skip naming why they cannot be
    made here (not root; ``ip netns add`` / the veth refused)."""
    reason = namespace_support()
    if reason:
        pytest.skip(reason)
    remove_stale_namespaces()
    lk = Link(tag)
    try:
        lk.create()
    except RuntimeError as exc:
        lk.close()
        pytest.skip(f"cannot create network namespaces and a veth pair here: {exc}")
    try:
        lk.configure()
    except BaseException:
        lk.close()
        raise
    return lk


@pytest.fixture
def link():
    lk = open_link(str(os.getpid()))
    try:
        yield lk
    finally:
        lk.close()
        left = _run("ip", "netns", "list", check=False).stdout
        assert lk.ns["mu"] not in left and lk.ns["pr"] not in left, left


class Proc:
    """A process in a namespace; its output lines kept (JSON lines parsed into ``events``).
    It gets SIGTERM should pytest die without stopping it (``setpriv --pdeathsig``)."""

    def __init__(self, name: str, ns: str, cmd: list[str], env: dict):
        self.name = name
        self.lines: list[str] = []
        self.events: list[dict] = []
        orphan_guard = ["setpriv", "--pdeathsig", "TERM", "--"] if shutil.which("setpriv") else []
        self.p = subprocess.Popen(orphan_guard + ["ip", "netns", "exec", ns] + cmd, stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True, bufsize=1, env=env,
                                  process_group=0)   # Ctrl-C of pytest is not theirs: stop() ends them
        self.thread = threading.Thread(target=self._pump, daemon=True)
        self.thread.start()

    def _pump(self) -> None:
        for line in self.p.stdout:
            line = line.rstrip("\n")
            if line.startswith("{"):
                try:
                    self.events.append(json.loads(line))
                    continue
                except ValueError:
                    pass
            self.lines.append(line)

    def stop(self) -> None:
        if self.p.poll() is None:
            self.p.send_signal(signal.SIGINT)
            try:
                self.p.wait(timeout=8)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait(timeout=5)
        self.thread.join(timeout=2)

    def tail(self, n: int = 25) -> str:
        return "\n".join(self.lines[-n:])


def node_cmd(name: str, params: dict, remappings=(), workdir: str = "") -> list[str]:
    return command_line(NodeSpec(name, name, params=params, remappings=list(remappings)), workdir)


def wait_for(cond, timeout: float, procs=()) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        for p in procs:
            assert p.p.poll() is None, f"{p.name} exited with {p.p.returncode}:\n{p.tail()}"
        time.sleep(0.05)
    return cond()


class Record:
    """What the robot peer reported, queried by wall time (time.monotonic)."""

    def __init__(self, robot: Proc):
        self.robot = robot

    def ticks(self, t0=-1e18, t1=1e18):
        return [e for e in list(self.robot.events) if e["ev"] == "tick" and t0 <= e["t"] <= t1]

    def diags(self, name: str, t0=-1e18, t1=1e18):
        return [e for e in list(self.robot.events)
                if e["ev"] == "diag" and e["name"] == name and t0 <= e["t"] <= t1]

    def last_diag(self, name: str) -> dict:
        d = self.diags(name)
        return d[-1]["values"] if d else {}

    def version(self) -> int:
        return int(self.last_diag("prediction").get("model_version", 0))

    def stream(self, t0: float, t1: float) -> dict:
        """Control-rate figures of the residual stream between two wall times.  A stamp
        break (instants skipped) is *excused* when the robot peer itself stalled (did
        not run for over 20 ms) in the half second before it: the host starved the
        processes then, which is not what this test is about."""
        ts = self.ticks(t0, t1)
        assert len(ts) >= 2, f"no ticks in [{t0}, {t1}]"
        a, b = ts[0], ts[-1]
        events = list(self.robot.events)
        stalls = [e for e in events if e["ev"] == "stall" and t0 - 0.5 <= e["t"] <= t1]
        breaks, excused, skipped = [], 0, 0
        for e in events:
            if e["ev"] != "break" or not t0 <= e["t"] <= t1:
                continue
            n = round((e["got"] - e["after"]) / (1e9 / CONTROL_HZ)) - 1
            if any(e["t"] - 0.5 <= st["t"] <= e["t"] + 0.05 for st in stalls):
                excused += 1
                skipped += max(n, 0)
            else:
                breaks.append(e)
        return {"s": round(b["t"] - a["t"], 2), "sent": b["sent"] - a["sent"], "res": b["res"] - a["res"],
                "stamp_breaks": len(breaks), "breaks_in_host_stalls": excused, "skipped_in_host_stalls": skipped,
                "nonfinite": b["nonfinite"] - a["nonfinite"], "zero": b["zero"] - a["zero"],
                "max_res_gap_ms": max(t["res_gap_ms"] for t in ts[1:]),
                "max_send_gap_ms": max(t["send_gap_ms"] for t in ts[1:]),
                "host_stalls_ms": [st["ms"] for st in stalls][:10], "breaks": breaks[:5]}

    def latencies(self, t0: float, t1: float) -> dict[int, tuple[float, float]]:
        """``{version: (publish -> receipt, publish -> applied) [ms]}`` of each version the
        prediction node reported in [t0, t1]: ``model_age_s - model_received_s_ago`` (from
        the snapshot's creation stamp to the receipt of its bytes; both namespaces share
        the host's clocks, 1 ms resolution), plus ``load_ms_last`` (decoding, checks and
        the trial prediction on the loader thread) for the time it was applied."""
        out = {}
        for e in self.diags("prediction", t0, t1):
            v = e["values"]
            if int(v.get("model_version", 0)) > 0 and "model_age_s" in v:
                recv = 1e3 * (float(v["model_age_s"]) - float(v["model_received_s_ago"]))
                out.setdefault(int(v["model_version"]), (round(recv, 1), round(recv + float(v["load_ms_last"]), 1)))
        return out


def check_rate(name: str, s: dict) -> None:
    """A residual for every control period in the window: none skipped, none late,
    except while the host starved the test's processes (see :meth:`Record.stream`)."""
    msg = f"{name}: {json.dumps(s)}"
    assert s["sent"] >= 0.8 * s["s"] * CONTROL_HZ, f"the robot peer could not keep its rate (host overloaded?) {msg}"
    assert s["skipped_in_host_stalls"] <= 0.05 * s["sent"], f"host overloaded: {msg}"
    assert s["stamp_breaks"] == 0 and s["nonfinite"] == 0 and s["zero"] == 0, msg
    assert abs(s["res"] + s["skipped_in_host_stalls"] - s["sent"]) <= 0.02 * s["sent"] + 20, msg
    assert s["max_res_gap_ms"] <= max(MAX_GAP_MS, s["max_send_gap_ms"] + 100), msg


def applied_sequence(rec: Record) -> list[int]:
    """Every applied version in order, from ``versions_applied`` (the last 16) and
    ``snapshots_applied`` (their count) of each prediction diagnostics message."""
    by_index: dict[int, int] = {}
    for e in rec.diags("prediction"):
        v = e["values"]
        listed = [int(x) for x in v.get("versions_applied", "").split()]
        count = int(v.get("snapshots_applied", 0))
        for i, ver in enumerate(listed):
            idx = count - len(listed) + i
            assert by_index.setdefault(idx, ver) == ver, (idx, ver, by_index[idx])
    assert sorted(by_index) == list(range(len(by_index))), f"applications missed by the diagnostics: {by_index}"
    return [by_index[i] for i in range(len(by_index))]


def test_skipped_with_the_reason_where_namespaces_cannot_be_made(monkeypatch):
    """Not root, or ``ip netns add`` refused: the test below is skipped naming why,
    never passed silently (and nothing is left behind)."""
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert "root" in namespace_support()
    with pytest.raises(pytest.skip.Exception, match="needs root"):
        open_link("x")

    calls = []

    def refused(*cmd, check=True):
        calls.append(cmd)
        if cmd[:3] == ("ip", "netns", "add"):
            raise RuntimeError("ip netns add ad_mu_x: mount --make-shared /run/netns failed: Operation not permitted")
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr(os, "geteuid", lambda: 0)
    monkeypatch.setattr(shutil, "which", lambda tool: f"/usr/sbin/{tool}")
    monkeypatch.setattr(sys.modules[__name__], "_run", refused)
    with pytest.raises(pytest.skip.Exception, match="cannot create network namespaces.*Operation not permitted"):
        open_link("x")
    assert not any(c[:3] == ("ip", "link", "add") for c in calls)


@pytest.mark.ros
@pytest.mark.slow
def test_split_across_two_network_namespaces(link, tmp_path, capsys):
    t_start = time.monotonic()
    here = int(os.environ.get("ROS_DOMAIN_ID", "0") or 0)
    domain, domain_lock = reserve_domain({here, 0})
    env = dict(os.environ, ROS_DOMAIN_ID=str(domain), ROS_AUTOMATIC_DISCOVERY_RANGE="SUBNET",
               FASTDDS_BUILTIN_TRANSPORTS="UDPv4", PYTHONUNBUFFERED="1", RCUTILS_COLORIZED_OUTPUT="0")
    env.pop("ROS_STATIC_PEERS", None)
    env.pop("FASTRTPS_DEFAULT_PROFILES_FILE", None)
    env.pop("FASTDDS_DEFAULT_PROFILES_FILE", None)
    mu, pr = link.ns["mu"], link.ns["pr"]
    wd = str(tmp_path)
    procs: list[Proc] = []
    try:
        procs.append(Proc("model_update", mu, node_cmd("model_update", {
            "robot": "planar2", "learner": "rbfn", "learner_config": json.dumps({"n_basis": 48, "width": 0.4}),
            "target": "torque", "target_torque": "measured",   # (the peer publishes no commands)
            "warmup": 30, "rbfn_box": "limits", "learn_decimation": 1, "block_size": 10,
            "publish_period": PUBLISH_PERIOD, "diagnostics_period": 0.2},
            [("joint_states", "learn/joint_states"), ("reference", "learn/reference")], wd), env))
        procs.append(Proc("prediction", pr, node_cmd("prediction", {
            "robot": "planar2", "learner": "rbfn", "monitor_decimation": 0, "diagnostics_period": 0.1,
            "prediction_lead": LEAD}, (), wd),
            env))
        procs.append(Proc("learn_peer", mu, [sys.executable, PEER, "learn", "--names", NAMES, "--rate",
                                             str(LEARN_HZ), "--prefix", "learn/"], env))
        robot = Proc("robot_peer", pr, [sys.executable, PEER, "robot", "--names", NAMES, "--rate",
                                        str(CONTROL_HZ)], env)
        procs.append(robot)
        rec = Record(robot)
        logs = lambda: "\n".join(f"--- {p.name}\n{p.tail()}" for p in procs)  # noqa: E731

        # ---------------------------------------------------------------- 1. link up
        assert wait_for(lambda: rec.version() >= 1 and rec.ticks() and rec.ticks()[-1]["res"] > 0, 40.0, procs), \
            logs()
        assert wait_for(lambda: rec.diags("model_update"), 10.0, procs), logs()
        t1 = time.monotonic()
        v1 = rec.version()
        assert wait_for(lambda: rec.version() >= v1 + 4 and time.monotonic() - t1 >= PHASE, 15.0, procs), \
            (rec.last_diag("prediction"), logs())
        t_down = time.monotonic()
        up = rec.stream(t1, t_down)
        check_rate("link up", up)
        assert rec.diags("model_update", t1, t_down), "model_update's diagnostics did not cross the link"
        held0 = int(rec.last_diag("prediction")["held_outputs"])

        # -------------------------------------------------------------- 2. link down
        link.set("down")
        v_down = rec.version()
        mu_down = int(rec.last_diag("model_update")["version"])
        time.sleep(OUTAGE)
        t_up = time.monotonic()
        link.set("up")
        down = rec.stream(t_down, t_up)
        check_rate("link down", down)
        quiet = rec.diags("prediction", t_down + PUBLISH_PERIOD + 0.3, t_up)
        assert len(quiet) >= 10, f"{len(quiet)} prediction diagnostics while the link was down"
        assert len({e["values"]["model_version"] for e in quiet}) == 1, "a version was applied while the link was down"
        assert int(quiet[0]["values"]["model_version"]) - v_down <= 1, (v_down, quiet[0])
        ago = [float(e["values"]["model_received_s_ago"]) for e in quiet]
        assert ago == sorted(ago) and ago[-1] >= OUTAGE - PUBLISH_PERIOD - 0.5, ago
        assert not rec.diags("model_update", t_down + 0.3, t_up), "model_update's diagnostics crossed the down link"
        assert int(quiet[-1]["values"]["held_outputs"]) == held0, "outputs held while the link was down"
        v_quiet = int(quiet[-1]["values"]["model_version"])

        # ------------------------------------------------------------ 3. link up again
        assert wait_for(lambda: rec.version() > v_quiet, 20.0, procs), (rec.last_diag("prediction"), logs())
        t_back = time.monotonic()
        # model_update's diagnostics come every diagnostics period: wait for the one that
        # reports the versions prediction already applied
        assert wait_for(lambda: rec.version() >= v_quiet + 3 and rec.diags("model_update", t_back)
                        and int(rec.last_diag("model_update")["version"]) > mu_down + 3
                        and time.monotonic() - t_up >= PHASE, 15.0, procs), (rec.last_diag("prediction"), logs())
        assert int(rec.last_diag("model_update")["version"]) > mu_down + 3, "model_update stopped during the outage"
        t_lim = time.monotonic()
        again = rec.stream(t_up, t_lim)
        check_rate("link up again", again)

        # ------------------------------------------------------- 4. link rate-limited
        link.limit(TBF_RATE)
        v_lim = rec.version()
        assert wait_for(lambda: rec.version() >= v_lim + 5 and time.monotonic() - t_lim >= PHASE, 20.0, procs), \
            (rec.last_diag("prediction"), logs())
        t_end = time.monotonic()
        qdisc = link.qdisc_stats()
        link.unlimit()
        limited = rec.stream(t_lim, t_end)
        check_rate("rate-limited", limited)
        size = int(rec.last_diag("model_update")["snapshot_bytes"])
        assert size >= SNAPSHOT_FLOOR, size
        wire_ms = 1e3 * 8 * (size - TBF_BURST) / TBF_RATE    # the first burst passes at once
        lat_free = rec.latencies(t1, t_down)
        lat_lim = {v: ms for v, ms in rec.latencies(t_lim, t_end).items() if v > v_lim + 1}
        assert len(lat_lim) >= 3, lat_lim
        # each snapshot took ~wire_ms to cross: many control periods, during which the
        # residual stream above went on without a stamp missing
        assert min(r for r, _ in lat_lim.values()) >= max(0.8 * wire_ms, 1e3 / CONTROL_HZ), (wire_ms, lat_lim)
        in_flight = sum(r for r, _ in lat_lim.values()) / (1e3 * (t_end - t_lim))

        # ------------------------------------------------------------ the whole run
        final = rec.last_diag("prediction")
        seq = applied_sequence(rec)
        assert seq == sorted(set(seq)) and len(seq) == int(final["snapshots_applied"]), seq
        refused = {k: int(v) for k, v in final.items() if k.startswith("refused_") and k != "refused_version"}
        assert not any(refused.values()), final
        assert int(final["held_outputs"]) == held0 and final.get("prediction_failed", "0") == "0", final
        for p in procs:
            assert p.p.poll() is None, f"{p.name} exited with {p.p.returncode}:\n{p.tail()}"

        def median(d, i):
            x = sorted(ms[i] for ms in d.values())
            return x[len(x) // 2] if x else None
        summary = {
            "snapshot_bytes": size, "tbf_bit_s": TBF_RATE, "tbf_burst_bytes": TBF_BURST,
            "wire_ms_per_snapshot": round(wire_ms, 1), "control_period_ms": 1e3 / CONTROL_HZ,
            "publish_to_receipt_ms_median": {"free": median(lat_free, 0), "rate_limited": median(lat_lim, 0)},
            "publish_to_apply_ms_median": {"free": median(lat_free, 1), "rate_limited": median(lat_lim, 1)},
            "per_version_ms_free": lat_free, "per_version_ms_rate_limited": lat_lim,
            "share_of_time_a_snapshot_was_in_flight_rate_limited": round(in_flight, 2),
            "outage_s": round(t_up - t_down, 2), "new_version_s_after_up": round(t_back - t_up, 2),
            "versions_applied": seq, "refused_version": int(final.get("refused_version", 0)),
            "residual_streams": {"up": up, "down": down, "up_again": again, "rate_limited": limited},
            "test_s": round(time.monotonic() - t_start, 1),
        }
        with capsys.disabled():
            print("\n[split across two network namespaces] " + json.dumps(summary))
            print("[tbf on the model-update side] " + " ".join(qdisc.split()))
    finally:
        for p in reversed(procs):
            p.stop()
        domain_lock.close()
