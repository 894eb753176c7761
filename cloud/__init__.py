"""zerolake's storage layer (local paths and gs:// behind one interface) and,
in cloud.registry, the model registry.  Start at :func:`cloud.storage.open_storage`."""

from cloud.storage import (
    AlreadyExists,
    NotFound,
    ObjectInfo,
    RetryPolicy,
    Storage,
    StorageError,
    add_retry_flags,
    is_remote,
    open_storage,
    retry_policy_from_args,
)

__all__ = [
    "AlreadyExists",
    "NotFound",
    "ObjectInfo",
    "RetryPolicy",
    "Storage",
    "StorageError",
    "add_retry_flags",
    "is_remote",
    "open_storage",
    "retry_policy_from_args",
]
