"""``sx.experimental``: TensorFlow's ``tf.distribute.experimental`` names, so guide code keeps them.

``PreemptionCheckpointHandler`` and ``TerminationConfig`` (save on a preemption notice in a
custom loop, and resume), and the names TensorFlow also lists here that stratax has at its top
level. Importing this module runs stratax's install step (it needs Keras).
"""

from stratax._src.keras.install import install as _install

_install()

from stratax import coordinator, partitioners  # noqa: E402
from stratax._src.distributed_input.input_context import ValueContext  # noqa: E402
from stratax._src.keras.preemption import (  # noqa: E402
    PreemptionCheckpointHandler,
    TerminationConfig,
)
from stratax._src.parameter_server.strategy import ParameterServerStrategy  # noqa: E402
from stratax._src.strategies.multi_worker import (  # noqa: E402
    CommunicationImplementation,
    CommunicationOptions,
    MultiWorkerMirroredStrategy,
)
from stratax._src.strategies.tpu import TPUStrategy  # noqa: E402

__all__ = [
    "CommunicationImplementation",
    "CommunicationOptions",
    "MultiWorkerMirroredStrategy",
    "ParameterServerStrategy",
    "PreemptionCheckpointHandler",
    "TPUStrategy",
    "TerminationConfig",
    "ValueContext",
    "coordinator",
    "partitioners",
]
