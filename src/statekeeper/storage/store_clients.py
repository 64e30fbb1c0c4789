"""The fsspec client of a URL, and the options of a client whose requests are bounded.

Per-request timeouts are known for s3fs (``s3://``) only: botocore's ``connect_timeout``
and ``read_timeout``, with its retries and s3fs's own turned off (the caller retries).
Other back-ends (gcsfs, adlfs, a local or NFS mount, ...) keep the timeouts given in their
``storage_options``; what statekeeper waits for them is bounded by its callers instead
(``Mirror.timeout`` on a resume's listing, ``Mirror.close_timeout`` on ``close()``).
"""

from __future__ import annotations

from typing import Any

from statekeeper.errors import InvalidArgumentError

__all__ = ["bounded_options", "filesystem"]


def filesystem(url: str, options: dict[str, Any]) -> tuple[Any, str]:
    """The fsspec file system of ``url`` and the path of ``url`` in it."""
    try:
        import fsspec
    except ImportError:
        raise InvalidArgumentError(
            f"{url}: URLs need the optional dependency fsspec: pip install 'statekeeper[fsspec]' "
            "(and s3fs or gcsfs for s3:// and gs://)"
        ) from None
    try:
        fs, root = fsspec.core.url_to_fs(url, **options)
    except (ImportError, ValueError) as exc:
        raise InvalidArgumentError(
            f"{url}: no usable fsspec back-end for this URL ({exc}); install the package that "
            "provides it (s3fs for s3://, gcsfs for gs://)"
        ) from None
    return fs, str(root).rstrip("/")


def bounded_options(fs: Any, options: dict[str, Any], seconds: float) -> dict[str, Any] | None:
    """``options`` for a client of its own of ``fs``'s back-end whose every request gives up
    after ``seconds`` without progress and is tried once; None where the back-end has no
    such options known here (see the module docstring)."""
    protocols = fs.protocol if isinstance(fs.protocol, tuple) else (fs.protocol,)
    if "s3" not in protocols:
        return None
    bounded = dict(options)
    config = dict(bounded.get("config_kwargs") or {})
    config.update(
        connect_timeout=seconds,
        read_timeout=seconds,
        retries={"max_attempts": 1, "mode": "standard"},
    )
    bounded.update(config_kwargs=config, skip_instance_cache=True)
    return bounded
