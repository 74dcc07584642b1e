"""The module model authors import as ``triton_python_backend_utils``.

The stub process puts this directory first on ``sys.path``; everything lives in
:mod:`serving.python_backend.pb_utils` so the stub and the model share one set of classes.
"""

from serving.python_backend.pb_utils import *  # noqa: F403
from serving.python_backend.pb_utils import ErrorCode, LogLevel, MetricKind  # noqa: F401
