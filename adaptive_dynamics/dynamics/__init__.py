"""ROS-free dynamics core: RobotModel, regressors, base parameters, inertial utilities."""
from .base_parameters import BaseParameters
from .filtered import FilteredRegressor
from .inertial import (
    PhysicalConsistencyError,
    check_physical_consistency,
    convert_order,
    from_mass_com_inertia,
    pseudo_inertia,
    transform_matrix,
)
from .model import RobotModel

__all__ = [
    "RobotModel", "FilteredRegressor", "BaseParameters", "PhysicalConsistencyError",
    "check_physical_consistency", "convert_order", "from_mass_com_inertia", "pseudo_inertia",
    "transform_matrix",
]
