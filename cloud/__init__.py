"""zerolake's storage layer (local paths and gs:// behind one interface) and,
in format.registry, the model registry.  Start at :func:`cloud.storage.open_storage`."""

from cloud.storage import *  # noqa: F401,F403  (the public surface is cloud.storage's)
from cloud.storage import __all__  # noqa: F401
