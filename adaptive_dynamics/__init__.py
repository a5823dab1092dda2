"""adaptive_dynamics: learn a torque-controlled robot's dynamics online while controlling it.

Layers (``docs/design.md``, checked by ``test/test_layers.py``): the units below ``ros``
(``dynamics``, ``learning``, ``control``, ``sim``, ``trajectories``, ``evaluation``, ...)
are plain Python/numpy/pinocchio with no ROS import; ``ros`` and ``nodes`` are thin
rclpy adapters.
"""

__version__ = "0.1.0"
