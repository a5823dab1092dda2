"""Thin shared ROS 2 layer: QoS profiles, one module per message concept, parameter
declaration/validation, node entry helper.

* :mod:`.qos` -- ``STREAM_QOS``, ``LATCHED_QOS``, ``COMMAND_QOS``, ``CLOCK_QOS``
  (the reasons are in that module's docstring).
* :mod:`.joint_states` -- ``joint_states`` by name: ``JointStateMapper.map`` (message or
  bytes -> stamp, q, v, effort), ``joint_state_msg``.
* :mod:`.references` -- the ``reference`` stream: ``ReferenceBuffer`` (``add_any``,
  ``lookup`` by stamp), ``reference_msg``, ``reference_batch_msg``.
* :mod:`.task_references` -- the ``task_reference`` stream (end-effector pose, twist,
  acceleration as ``MultiDOFJointTrajectory``): ``TaskReferenceBuffer``,
  ``task_reference_msg``.
* :mod:`.commands` -- effort commands stamped with the state they answer:
  ``encode_stamped_command``, ``split_command`` / ``command_values``.
* :mod:`.arrays` -- stamped vectors (``JointState``) and matrices
  (``Float64MultiArray`` with ``data_offset = 2`` holding the stamp).
* :mod:`.stamps` -- ``to_ns`` / ``from_ns``; :mod:`.fields` -- the by-name matching,
  finiteness and float64-field rules the modules above share.
* :mod:`.params` -- ``ParamSpec``, ``declare_params`` -> ``ParamStore``,
  ``load_param_file``.
* :mod:`.node_base` -- ``run_node``, ``Counters`` (diagnostics).
"""

from .commands import command_from_msg, float64_array_msg
from .fields import JointMismatchError, NonFiniteError
from .joint_states import JointStateMapper, joint_state_msg
from .node_base import Counters, diagnostic_array, run_node
from .params import ParamSpec, ParamStore, declare_params, load_param_file, to_parameters
from .qos import CLOCK_QOS, COMMAND_QOS, LATCHED_QOS, STREAM_QOS
from .references import Reference, ReferenceBuffer, reference_msg
from .arrays import matrix_from_msg, matrix_labels, stamped_matrix_msg, stamped_vector_msg, vector_from_msg
from .stamps import from_ns, to_ns

__all__ = [
    "STREAM_QOS", "LATCHED_QOS", "COMMAND_QOS", "CLOCK_QOS",
    "JointMismatchError", "NonFiniteError", "JointStateMapper", "Reference", "ReferenceBuffer",
    "command_from_msg", "float64_array_msg", "from_ns", "to_ns", "joint_state_msg",
    "matrix_from_msg", "matrix_labels", "reference_msg", "stamped_matrix_msg",
    "stamped_vector_msg", "vector_from_msg",
    "ParamSpec", "ParamStore", "declare_params", "load_param_file", "to_parameters",
    "run_node", "Counters", "diagnostic_array",
]
