"""QoS profiles shared by every node, with the reason for each choice.

DDS matches a publisher and a subscription only if their QoS are *compatible*
(request-vs-offered): a subscription may ask for less than the publisher offers,
never more.  The two rules that matter here:

* reliability: a RELIABLE subscription does NOT receive from a BEST_EFFORT
  publisher; a BEST_EFFORT subscription receives from both.
* durability: a TRANSIENT_LOCAL subscription does NOT receive from a VOLATILE
  publisher; a VOLATILE subscription receives from both (but gets no history).

``STREAM_QOS`` -- 1 kHz streams (``joint_states``, ``reference``, regressors,
feed-forward): BEST_EFFORT, KEEP_LAST depth 1, VOLATILE.  At control rate a
late sample is worthless (the next one is 1 ms away), so we never want
retransmissions or queued backlog; depth 1 means a slow consumer always sees
the newest sample instead of working through a queue.  Consumers that need a
sample for a *specific* instant pick it by stamp (see
``references.ReferenceBuffer``), not by arrival.  A best-effort subscription
also connects to reliable publishers such as ros2_control's
``joint_state_broadcaster`` (which publishes with ``SystemDefaultsQoS``:
reliable, depth 10).  Caveat: tools that subscribe RELIABLE (RViz's default,
for example) do not receive our best-effort streams unless they are set to
best effort; ``ros2 topic echo`` and rosbag2 adapt to the publisher.

``LATCHED_QOS`` -- models, parameter estimates, configuration snapshots:
RELIABLE, TRANSIENT_LOCAL, KEEP_LAST depth 1.  These change rarely and must
not be lost; a node that starts (or restarts) late receives the latest value
immediately ("latched" topic in ROS 1 terms).  Subscriptions should use the
same profile: a TRANSIENT_LOCAL subscription is what asks for the history.

``DEEP_RELIABLE_QOS`` -- ``adaptive/parametric_torque`` and
``adaptive/parameter_update`` as the learners (``residual_learner``, ``model_update``)
subscribe them: RELIABLE, KEEP_LAST depth 1000, VOLATILE.  Every parametric torque
makes a learning sample and every parameter update must be applied in stream order,
in lockstep and in real time alike, so none may be dropped or overwritten while the
learner's executor is busy.

``COMMAND_QOS`` -- effort commands (``effort_controller/commands``): RELIABLE,
KEEP_LAST depth 1, VOLATILE.  ros2_control's ``forward_command_controller``
(the effort controller on franka_ros2, KUKA FRI stacks, gz_ros2_control)
subscribes to ``~/commands`` with ``rclcpp::SystemDefaultsQoS()``, whose
reliability is whatever the RMW's default is: with rmw_fastrtps (the Kilted
default, and what this venv runs) a SYSTEM_DEFAULT *reader* resolves to
best effort + volatile (checked with ``get_subscriptions_info_by_topic``), but
other RMWs, XML/env profiles or a controller configured with ``rclcpp::QoS(10)``
give a RELIABLE reader, and a BEST_EFFORT publisher silently never connects to
that.  A RELIABLE publisher matches readers of either kind, so commands are
published RELIABLE.  Depth 1 because only the newest torque command is
meaningful (a reliable writer with depth 1 never blocks: an unacknowledged
older sample is simply replaced).  VOLATILE on purpose: a late joining
hardware interface must never be handed an old, stale torque command.  The
lockstep simulator bridge also relies on reliability: a lost command would
stall the step until the lockstep timeout.

``CLOCK_QOS`` -- ``/clock``: BEST_EFFORT, KEEP_LAST depth 1, VOLATILE, exactly
what rclpy's ``TimeSource`` subscribes with
(``QoSProfile(depth=1, reliability=BEST_EFFORT)`` in ``rclpy/time_source.py``
of the installed Kilted rclpy) and what rclcpp's ``ClockQoS`` is.  The bridge
publishes ``/clock`` with it so every ``use_sim_time`` node (C++ or Python)
connects.
"""

from __future__ import annotations

from rclpy.qos import (
    DurabilityPolicy,
    HistoryPolicy,
    QoSProfile,
    ReliabilityPolicy,
)

__all__ = ["STREAM_QOS", "LATCHED_QOS", "COMMAND_QOS", "LOCKSTEP_COMMAND_QOS", "REALTIME_COMMAND_QOS", "CLOCK_QOS", "RELIABLE_STREAM_QOS",
           "REFERENCE_QOS", "PUBLISHER_STREAM_QOS", "DEEP_RELIABLE_QOS", "stream_qos", "describe_qos"]

STREAM_QOS = QoSProfile(
    history=HistoryPolicy.KEEP_LAST,
    depth=1,
    reliability=ReliabilityPolicy.BEST_EFFORT,
    durability=DurabilityPolicy.VOLATILE,
)

LATCHED_QOS = QoSProfile(
    history=HistoryPolicy.KEEP_LAST,
    depth=1,
    reliability=ReliabilityPolicy.RELIABLE,
    durability=DurabilityPolicy.TRANSIENT_LOCAL,
)

DEEP_RELIABLE_QOS = QoSProfile(
    history=HistoryPolicy.KEEP_LAST,
    depth=1000,
    reliability=ReliabilityPolicy.RELIABLE,
    durability=DurabilityPolicy.VOLATILE,
)

COMMAND_QOS = QoSProfile(
    history=HistoryPolicy.KEEP_LAST,
    depth=1,
    reliability=ReliabilityPolicy.RELIABLE,
    durability=DurabilityPolicy.VOLATILE,
)

# The lockstep bridge's command subscription: a queue, not "the latest".  With depth 1
# a controller's unstamped watchdog zero, arriving while the bridge is starved, would
# overwrite the stamped answer still waiting in the reader and stall the loop.
LOCKSTEP_COMMAND_QOS = QoSProfile(
    history=HistoryPolicy.KEEP_LAST,
    depth=100,
    reliability=ReliabilityPolicy.RELIABLE,
    durability=DurabilityPolicy.VOLATILE,
)

# The real-time bridge's command subscription: a few commands kept, not one, so two
# arriving while the loop is busy (stepping, publishing) are both taken -- a late answer
# is measured rather than overwritten -- and the newest applied.  BEST_EFFORT, as
# ros2_control's effort controller reads them under rmw_fastrtps: a RELIABLE reader
# delivers in order, so one sample lost on the way (a shared-memory port that
# overflowed while the reader's process was descheduled) holds every newer command
# back until the protocol repairs the hole -- measured here: commands of 2.28 s
# delivered at 2.61 s, 330 ms without control, every cycle a deadline miss.  A lost
# command is one miss; the next one is the newest anyway.  A best-effort reader
# matches any command publisher (COMMAND_QOS, ros2_control's SystemDefaultsQoS);
# reader depth is not part of QoS matching.
REALTIME_COMMAND_QOS = QoSProfile(
    history=HistoryPolicy.KEEP_LAST,
    depth=8,
    reliability=ReliabilityPolicy.BEST_EFFORT,
    durability=DurabilityPolicy.VOLATILE,
)

CLOCK_QOS = QoSProfile(
    history=HistoryPolicy.KEEP_LAST,
    depth=1,
    reliability=ReliabilityPolicy.BEST_EFFORT,
    durability=DurabilityPolicy.VOLATILE,
)


# Lockstep: every step's joint_states must reach the controller (a lost sample stalls
# the loop until the bridge's timeout and breaks run-to-run determinism), so lockstep
# graphs subscribe reliably.  A reliable publisher serves best-effort readers too.
RELIABLE_STREAM_QOS = QoSProfile(
    history=HistoryPolicy.KEEP_LAST,
    depth=10,
    reliability=ReliabilityPolicy.RELIABLE,
    durability=DurabilityPolicy.VOLATILE,
)

# References are published ahead of the instant they apply to: a reliable queue deep
# enough for the look-ahead horizon, so none is lost or overwritten before use, and
# transient-local so a controller that joins late still receives the window ahead.
REFERENCE_QOS = QoSProfile(
    history=HistoryPolicy.KEEP_LAST,
    depth=200,
    reliability=ReliabilityPolicy.RELIABLE,
    durability=DurabilityPolicy.TRANSIENT_LOCAL,
)


# Publishers of 1 kHz streams in lockstep: a deep reliable writer history, so a slower
# reader (the recorder) is never overrun (a reliable writer only re-sends what is still
# in its history); ~5 s of samples at 1 kHz.
PUBLISHER_STREAM_QOS = QoSProfile(
    history=HistoryPolicy.KEEP_LAST,
    depth=5000,
    reliability=ReliabilityPolicy.RELIABLE,
    durability=DurabilityPolicy.VOLATILE,
)


def stream_qos(reliable: bool) -> QoSProfile:
    """QoS for a 1 kHz stream: reliable in lockstep, best effort in real time."""
    return RELIABLE_STREAM_QOS if reliable else STREAM_QOS


def describe_qos(profile: QoSProfile) -> str:
    """One-line human readable summary (for logs and the README)."""
    return (
        f"{profile.reliability.name.lower()}, {profile.durability.name.lower()}, "
        f"{profile.history.name.lower()} depth {profile.depth}"
    )
