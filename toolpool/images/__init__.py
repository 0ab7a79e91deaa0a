"""Image roots for sessions: images read, verified, unpacked once into a shared cache.

A session's root may be an image (a root file system directory, an OCI image layout,
a ``docker save`` tarball) under the daemon's ``image_dirs``. ``ImageCache.prepare``
admits it (``access``), reads it (``formats``), unpacks each layer in a process under
limits (``unpacking``, ``unpack``) into the content-addressed cache (``cache``) and
holds its layers with a lease (``leases``) while a session uses them. Mounting the
layers is the session's business; this package only gives it the layers.

A leaf: it imports toolpool.errors, toolpool.sandbox.policy and the standard library.
"""

from toolpool.images.cache import ImageCache, PreparedImage, default_cache_root
from toolpool.images.errors import ImageError
from toolpool.images.leases import Lease
from toolpool.images.unpacking import UnpackLimits, XattrKind

__all__ = [
    "ImageCache",
    "ImageError",
    "Lease",
    "PreparedImage",
    "UnpackLimits",
    "XattrKind",
    "default_cache_root",
]
