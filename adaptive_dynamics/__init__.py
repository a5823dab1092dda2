"""adaptive_dynamics: learn a torque-controlled robot's dynamics online while controlling it.

Layers (see README): ``dynamics``, ``control``, ``learning``, ``sim``, ``trajectories``,
``evaluation`` are plain Python/numpy/pinocchio with no ROS import; ``nodes`` and ``ros``
are thin rclpy adapters.
"""

__version__ = "0.1.0"
