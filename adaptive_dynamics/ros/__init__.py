"""Thin shared ROS 2 layer: QoS profiles, message <-> numpy conversions,
parameter declaration/validation, node entry helper.

* :mod:`.qos` -- ``STREAM_QOS``, ``LATCHED_QOS``, ``COMMAND_QOS``, ``CLOCK_QOS``
  (the reasons are in that module's docstring).
* :mod:`.conversions` -- joint states by name, commands, stamped references,
  stamped vectors (``JointState``) and matrices (``Float64MultiArray`` with
  ``data_offset = 2`` holding the stamp); see its docstring for the convention.
* :mod:`.params` -- ``ParamSpec``, ``declare_params`` -> ``ParamStore``,
  ``load_param_file``.
* :mod:`.node_base` -- ``run_node``, ``Counters`` (diagnostics).
"""

from .conversions import (
    JointMismatchError,
    JointStateMapper,
    NonFiniteError,
    Reference,
    ReferenceBuffer,
    command_from_msg,
    float64_array_msg,
    from_ns,
    joint_state_msg,
    matrix_from_msg,
    matrix_labels,
    reference_msg,
    stamped_matrix_msg,
    stamped_vector_msg,
    to_ns,
    vector_from_msg,
)
from .node_base import Counters, diagnostic_array, run_node
from .params import ParamSpec, ParamStore, declare_params, load_param_file, to_parameters
from .qos import CLOCK_QOS, COMMAND_QOS, LATCHED_QOS, STREAM_QOS

__all__ = [
    "STREAM_QOS", "LATCHED_QOS", "COMMAND_QOS", "CLOCK_QOS",
    "JointMismatchError", "NonFiniteError", "JointStateMapper", "Reference", "ReferenceBuffer",
    "command_from_msg", "float64_array_msg", "from_ns", "to_ns", "joint_state_msg",
    "matrix_from_msg", "matrix_labels", "reference_msg", "stamped_matrix_msg",
    "stamped_vector_msg", "vector_from_msg",
    "ParamSpec", "ParamStore", "declare_params", "load_param_file", "to_parameters",
    "run_node", "Counters", "diagnostic_array",
]
