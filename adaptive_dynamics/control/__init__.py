"""ROS-free control laws: PD / computed torque (baseline), direct and composite adaptive,
task-space MRAC (SCQP)."""
from .adaptive import AdaptiveController, spd_gain
from .baseline import ComputedTorqueController, PDController, make_controller, saturate
from .mrac import TaskSpaceMRAC
from .projection import consistency_margins, project_consistent

__all__ = ["AdaptiveController", "spd_gain", "PDController", "ComputedTorqueController", "make_controller",
           "saturate", "consistency_margins", "project_consistent", "TaskSpaceMRAC"]
