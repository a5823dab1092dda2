"""Process entry helper and diagnostics counters shared by the nodes.

``run_node(MyNode)`` is the body of every node module's ``main()``:
``rclpy.init`` (which installs rclpy's SIGINT/SIGTERM handlers), construct the
node, spin it on a single- or multi-threaded executor, and shut down cleanly
on Ctrl-C, SIGTERM (what ``ros2 launch`` and the pip launcher send) or an
external ``rclpy.shutdown``; exit status 0 in those cases.

``Counters`` accumulates named event counts (deadline misses, rejected
messages, lockstep timeouts, ...) and gauges, and renders them as a
``diagnostic_msgs/DiagnosticStatus``.  Values are cumulative; the *level* of a
status reflects what happened since the previous status (a counter listed in
``warn_on``/``error_on`` that increased), so one old deadline miss does not
keep the node in WARN forever.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from typing import Any, Dict, Iterable, Optional, Sequence

import rclpy
from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus, KeyValue
from rclpy.executors import ExternalShutdownException, MultiThreadedExecutor, SingleThreadedExecutor

from .stamps import from_ns

__all__ = ["run_node", "Counters", "HotPath", "diagnostic_array", "OK", "WARN", "ERROR", "STALE"]

OK = DiagnosticStatus.OK
WARN = DiagnosticStatus.WARN
ERROR = DiagnosticStatus.ERROR
STALE = DiagnosticStatus.STALE
_LEVEL_NAMES = {OK: "OK", WARN: "WARN", ERROR: "ERROR", STALE: "STALE"}


def make_executor(*, multithreaded: bool = False, num_threads: Optional[int] = None, context=None):
    """The executor for a node process.

    ``AD_EXECUTOR=single|multi|events`` selects it; the default is rclpy's
    ``SingleThreadedExecutor`` (``MultiThreadedExecutor`` when ``multithreaded``).
    ``events`` is rclpy's experimental ``EventsExecutor`` (less overhead per callback,
    but it busy-loops in our graph on this rclpy version, see the README).
    """
    import os
    choice = os.environ.get("AD_EXECUTOR", "multi" if multithreaded else "single")
    if choice == "multi":
        return MultiThreadedExecutor(num_threads=num_threads, context=context)
    if choice == "events":
        try:
            from rclpy.experimental import EventsExecutor
            return EventsExecutor(context=context)
        except ImportError:  # pragma: no cover - older rclpy
            pass
    return SingleThreadedExecutor(context=context)


#: a thread that runs a node of an in-process graph (:mod:`adaptive_dynamics.inprocess`) sets
#: ``context`` here: :func:`run_node` then runs in that rclpy context, without signal handlers
_thread_graph = threading.local()


@contextlib.contextmanager
def node_context(context):
    """Within it, :func:`run_node` on this thread initialises and runs in ``context`` (an
    ``rclpy.context.Context`` of its own, no signal handlers) instead of rclpy's default
    one: what an in-process graph's node threads do."""
    _thread_graph.context = context
    try:
        yield context
    finally:
        _thread_graph.context = None


def run_node(node_cls, args: Optional[Sequence[str]] = None, *, multithreaded: bool = False,
             num_threads: Optional[int] = None, **node_kwargs: Any) -> int:
    """Run ``node_cls(**node_kwargs)`` until shutdown; returns the exit status.

    ``node_cls`` may also be a list of node classes/factories: they are
    composed in one process on one executor (then ``node_kwargs`` must be
    empty).  ``args`` defaults to ``sys.argv`` (so ``--ros-args -r ... -p ...
    --params-file ...`` work).  Nodes are created in rclpy's default context, or in
    the thread's own (:func:`node_context`).
    Exceptions other than a shutdown request propagate after cleanup.
    """
    factories = list(node_cls) if isinstance(node_cls, (list, tuple)) else [node_cls]
    if len(factories) > 1 and node_kwargs:
        raise ValueError("node_kwargs only apply to a single node class")
    context = getattr(_thread_graph, "context", None)
    argv = list(sys.argv if args is None else args)
    if context is None:
        rclpy.init(args=argv)
        ctx_kw: dict = {}
    else:
        from rclpy.signals import SignalHandlerOptions
        rclpy.init(args=argv, context=context, signal_handler_options=SignalHandlerOptions.NO)
        ctx_kw = {"context": context}
    nodes = []
    executor = None
    try:
        for f in factories:
            nodes.append(f(**node_kwargs, **ctx_kw))
        executor = make_executor(multithreaded=multithreaded, num_threads=num_threads, **ctx_kw)
        for n in nodes:
            executor.add_node(n)
        executor.spin()
    except (KeyboardInterrupt, ExternalShutdownException):
        pass
    except Exception:
        # rclpy's SIGTERM/SIGINT handler shuts the context down asynchronously;
        # a spin racing with it can raise RCLError ("context is not valid")
        # while building its wait set.  That is a shutdown, not a failure.
        if rclpy.ok(**ctx_kw):
            raise
    finally:
        if executor is not None:
            try:
                executor.shutdown(timeout_sec=1.0)
            except Exception:
                pass
        for n in nodes:
            try:
                n.destroy_node()
            except Exception:  # the context may already be invalid after a signal
                pass
        rclpy.try_shutdown(**ctx_kw)
    return 0


class HotPath:
    """A lean companion node that carries a node's per-cycle subscriptions, spun by its
    own executor thread.

    rclpy's wait-set executors rebuild and scan the wait set of *every* entity of the
    nodes they spin on each ``spin_once``: the parameter services (6), the type
    description service, user services and timers.  At 1 kHz that is most of a
    Python node's cycle.  The companion ``<owner name>_io`` has none of these
    (``start_parameter_services=False``, no rosout, no type description service), so
    its executor's wait set holds only the hot subscriptions; it measured ~1.6x more
    round trips per second here.  It inherits the owner's namespace and topic remaps
    (not ``use_sim_time``: use the owner's clock); its node name is ``<owner name>_io`` even under a global
    ``__node:=`` remap (a node-local remap wins).

    The companion is not spun by an rclpy executor but by a lean wait-set loop
    (:meth:`_lean_spin`): one ``rcl`` wait set holding its subscriptions and a stop guard
    condition, reused every cycle; whatever is ready is taken and handed to its callback
    directly.  rclpy's ``SingleThreadedExecutor`` wraps each callback in a task, a
    generator, a callback-group check and an ``ExitStack`` and rebuilds the wait set
    every time: profiled here (py-spy, lockstep bridge) that machinery held the GIL for
    ~45 % of the hot thread's time.  The loop takes up to ``DRAIN_LIMIT`` messages from
    each ready subscription per wake-up (in order per topic, as with the executor).
    ``AD_HOT_PATH=executor`` falls back to the executor (for comparison).  Only plain
    subscriptions are served there: no timers, services or QoS-event callbacks on the
    companion (create those on the owner).  A callback that raises is logged with its
    traceback (throttled) and counted in ``callback_errors``; the loop goes on.

    Callbacks then run on the companion's thread while the owner's timers, services and
    parameter callbacks run on the main executor: guard shared state with a lock.
    ``enabled=False`` returns the owner itself (no thread; everything on one executor).
    """

    def __init__(self, owner, *, enabled: bool = True):
        from rclpy.node import Node
        from rclpy.parameter import Parameter

        self.owner = owner
        self.enabled = bool(enabled)
        self._thread = None
        self.callback_errors = 0
        self._held, self._subs, self._wait_set, self._entries = None, None, None, ()
        self._periodic: list = []
        if not self.enabled:
            self.node = owner
            self.executor = None
            return
        name = f"{owner.get_name()}_io"
        # no use_sim_time: the companion only carries callbacks (time comes from the owner),
        # and a /clock subscription of its own would count as one more sim-time node
        overrides = [Parameter("start_type_description_service", value=False)]
        self.node = Node(name, namespace=owner.get_namespace(), context=owner.context,
                         cli_args=["--ros-args", "-r", f"__node:={name}"],
                         start_parameter_services=False, enable_rosout=False,
                         parameter_overrides=overrides)
        import os
        self.lean = os.environ.get("AD_HOT_PATH", "lean") != "executor"
        self._stop = threading.Event()
        self._last_error_log = 0.0
        if self.lean:
            self.executor = None
            self._guard = self.node.create_guard_condition(lambda: None)
        else:
            self.executor = SingleThreadedExecutor(context=owner.context)
            self.executor.add_node(self.node)

    def report(self, counters: "Counters") -> None:
        """Put ``callback_errors`` (hot-path callbacks that raised) into a node's
        diagnostics as a gauge once it is non-zero (each error is also logged)."""
        if self.enabled and self.node is not self.owner and self.callback_errors:
            counters.set("callback_errors", self.callback_errors)

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> None:
        if not self.enabled or self._thread is not None:
            return
        target = self._lean_spin if self.lean else self._spin
        self.shorten_switch_interval()
        self._thread = threading.Thread(target=target, name=self.node.get_name(), daemon=True)
        self._thread.start()

    @staticmethod
    def shorten_switch_interval() -> None:
        """A thread woken by a message (or its tick) waits for the GIL until its holder
        blocks or the interpreter's switch interval (5 ms by default) forces a hand-over:
        with another thread's Python running, that is a whole 1 kHz period.  0.2 ms
        (``AD_SWITCH_INTERVAL`` [s]; 0 keeps Python's) bounds it.  Process-wide."""
        import os
        interval = float(os.environ.get("AD_SWITCH_INTERVAL", "0.0002"))
        if interval > 0:
            sys.setswitchinterval(min(sys.getswitchinterval(), interval))

    def _spin(self) -> None:
        try:
            self.executor.spin()
        except (KeyboardInterrupt, ExternalShutdownException):
            pass
        except Exception:
            if self.owner.context.ok():
                raise

    #: messages taken from one ready subscription before the others get their turn (a
    #: stream arriving faster than its callback runs must not starve the rest)
    DRAIN_LIMIT = 16
    #: longest blocking wait of the companion's own thread (it re-checks stop/shutdown)
    IDLE_WAIT_NS = 200_000_000

    def add_periodic(self, period_s: float, fn) -> bool:
        """Call ``fn()`` every ``period_s`` (steady clock) on the companion's own thread,
        between messages: a watchdog that shares the hot path's state then runs where
        that state lives, without waking the owner's executor (whose every wake-up
        costs the hot thread GIL time).  Returns False when there is no lean thread
        (``enabled=False`` or ``AD_HOT_PATH=executor``): use an owner timer then.
        Keep ``fn`` short and non-blocking (no file I/O): it delays the next message."""
        if not (self.enabled and self.lean) or self._thread is not None:
            return False
        self._periodic.append([int(period_s * 1e9), fn, time.perf_counter_ns()])
        return True

    def _run_periodic(self) -> int:
        """Call what is due; returns the ns until the next is due."""
        now = time.perf_counter_ns()
        nxt = self.IDLE_WAIT_NS
        for item in self._periodic:
            period, fn, due = item
            if now >= due:
                try:
                    fn()
                except Exception as exc:  # like a callback: logged, counted, the loop goes on
                    self._callback_failed(fn, exc)
                due = item[2] = max(due + period, now)
            nxt = min(nxt, due - now)
        return max(0, nxt)

    def _lean_spin(self) -> None:
        """The companion's own thread: :meth:`spin_once` (and what :meth:`add_periodic`
        registered) until stopped."""
        try:
            while not self._stop.is_set() and self.node.context.ok():
                self.spin_once(self._run_periodic() if self._periodic else self.IDLE_WAIT_NS)
        except (KeyboardInterrupt, ExternalShutdownException):
            pass
        except Exception:
            if self.node.context.ok() and not self._stop.is_set():
                raise
        finally:
            self.release()

    def spin_once(self, timeout_ns: int) -> int:
        """Wait up to ``timeout_ns`` (0 = poll) for the companion's subscriptions, take
        what is ready and hand it to the callbacks; returns the number of messages taken.

        Serves the companion's own thread, or a caller that runs its own loop instead
        of :meth:`start` (the bridge's real-time loop takes commands between its ticks
        this way: one thread, no hand-over).  Call it from one thread only."""
        from rclpy.exceptions import InvalidHandle
        from rclpy.impl.implementation_singleton import rclpy_implementation as _rclpy
        from rclpy.subscription import Subscription

        current = tuple(self.node.subscriptions)
        if current != self._subs:  # (re)built when a subscription was added or removed
            # the handles in use are held (entered) from one (re)build to the next, as
            # rclpy's executor holds them across its wait: a subscription destroyed
            # meanwhile is only released once the loop has let go of it
            self.release()
            held = contextlib.ExitStack()
            held.enter_context(self.node.context.handle)
            live = []
            for s in current:
                try:
                    held.enter_context(s.handle)
                    live.append(s)
                except InvalidHandle:  # destroyed already
                    pass
            self._held, self._subs = held, current
            self._wait_set = _rclpy.WaitSet(len(live), 1, 0, 0, 0, 0, self.node.context.handle)
            self._entries = tuple((s.handle, s.msg_type, s.raw, s.callback,
                                   s._callback_type is Subscription.CallbackType.MessageOnly)
                                  for s in live)
        wait_set = self._wait_set
        wait_set.clear_entities()
        for e in self._entries:
            wait_set.add_subscription(e[0])
        wait_set.add_guard_condition(self._guard.handle)
        wait_set.wait(timeout_ns)
        if self._stop.is_set():
            return 0
        ready = wait_set.get_ready_entities("subscription")
        if not ready:
            return 0
        n = 0
        for h, msg_type, raw, callback, message_only in self._entries:
            if h.pointer not in ready:
                continue
            for _ in range(self.DRAIN_LIMIT):  # a ready subscription may hold several
                taken = h.take_message(msg_type, raw)
                if taken is None:
                    break
                n += 1
                try:
                    if message_only:
                        callback(taken[0])
                    else:
                        callback(*taken)
                except Exception as exc:  # keep the hot path alive, say what failed
                    self._callback_failed(callback, exc)
        return n

    def release(self) -> None:
        """Let go of the handles :meth:`spin_once` holds (it re-acquires them if called again)."""
        if self._held is not None:
            self._held.close()
        self._held, self._subs, self._wait_set, self._entries = None, None, None, ()

    def _callback_failed(self, callback, exc: BaseException) -> None:
        import traceback
        self.callback_errors += 1
        now = time.monotonic()
        if now - self._last_error_log > 1.0:
            self._last_error_log = now
            self.owner.get_logger().error(
                f"{getattr(callback, '__qualname__', callback)} raised {type(exc).__name__}: {exc}"
                f" ({self.callback_errors} callback errors so far)\n{traceback.format_exc()}")

    def stop(self) -> None:
        if not self.enabled or self.node is self.owner:
            return
        if self._stop.is_set() and self._thread is None:
            return
        self._stop.set()
        if self.executor is not None:
            try:
                self.executor.shutdown(timeout_sec=1.0)
            except Exception:
                pass
        else:
            try:
                self._guard.trigger()
            except Exception:
                pass
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=1.0)
        self._thread = None
        try:
            self.node.destroy_node()
        except Exception:
            pass
        self.executor = None


class Counters:
    """Named counters and gauges -> ``diagnostic_msgs/DiagnosticStatus``."""

    def __init__(self, name: str, hardware_id: str = "", *,
                 warn_on: Iterable[str] = (), error_on: Iterable[str] = ()):
        self.name = name
        self.hardware_id = hardware_id
        self.warn_on = tuple(warn_on)
        self.error_on = tuple(error_on)
        self._values: Dict[str, Any] = {}
        self._reported: Dict[str, Any] = {}
        self._lock = threading.Lock()
        for k in self.warn_on + self.error_on:
            self._values.setdefault(k, 0)

    def inc(self, key: str, n: int = 1) -> None:
        with self._lock:
            self._values[key] = self._values.get(key, 0) + n

    def set(self, key: str, value: Any) -> None:
        """A gauge (any value; shown as text)."""
        with self._lock:
            self._values[key] = value

    def update(self, values: Dict[str, Any]) -> None:
        """Several gauges at once: a status shows all of them changed or none."""
        with self._lock:
            self._values.update(values)

    def __getitem__(self, key: str) -> Any:
        return self._values.get(key, 0)

    def as_dict(self) -> Dict[str, Any]:
        with self._lock:
            return dict(self._values)

    def reset(self) -> None:
        with self._lock:
            for k in list(self._values):
                self._values[k] = 0 if k in self.warn_on + self.error_on else self._values[k]
            self._reported.clear()

    def _increase(self, key: str) -> int:
        v, r = self._values.get(key, 0), self._reported.get(key, 0)
        try:
            return int(v - r)
        except TypeError:
            return 0

    def status(self, level: Optional[bytes] = None, message: Optional[str] = None) -> DiagnosticStatus:
        """Snapshot as a DiagnosticStatus; the level is computed unless given."""
        with self._lock:
            errs = [(k, self._increase(k)) for k in self.error_on if self._increase(k) > 0]
            warns = [(k, self._increase(k)) for k in self.warn_on if self._increase(k) > 0]
            values = dict(self._values)
            self._reported = dict(values)
        if level is None:
            level = ERROR if errs else WARN if warns else OK
        if message is None:
            parts = [f"{k} +{d}" for k, d in errs + warns]
            message = ", ".join(parts) + " since last report" if parts else "OK"
        st = DiagnosticStatus()
        st.level = level
        st.name = self.name
        st.message = message
        st.hardware_id = self.hardware_id
        st.values = [KeyValue(key=str(k), value=str(v)) for k, v in values.items()]
        return st


def diagnostic_array(stamp, statuses: Iterable[DiagnosticStatus]) -> DiagnosticArray:
    """``diagnostic_msgs/DiagnosticArray`` for the ``/diagnostics`` topic."""
    msg = DiagnosticArray()
    msg.header.stamp = from_ns(stamp)
    msg.status = list(statuses)
    return msg


def level_name(level: bytes) -> str:
    return _LEVEL_NAMES.get(level, repr(level))
