"""zerolake's storage layer: local paths and gs:// behind one interface.  Start at
:func:`cloud.storage.open_storage`.  (The model registry built on it is format.registry, a floor up.)"""

from cloud.storage import *  # noqa: F401,F403  (the public surface is cloud.storage's)
from cloud.storage import __all__  # noqa: F401
