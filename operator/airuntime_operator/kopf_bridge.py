"""Where the shared Kubernetes client meets kopf: credentials and failure outcomes.

Why a module of its own: :mod:`airuntime.k8s.client` is shared with the control
plane and knows nothing of kopf. What only the operator needs sits here -- the same
credentials handed to kopf's own API client (the login handler), and the
classification of a failed API request into kopf's retry outcomes.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from contextlib import contextmanager

import kopf

from airuntime.k8s.client import ApiError, KubeApi

__all__ = ["api_failure", "api_outcomes", "connection_info", "retry_delay"]


def connection_info(kube: KubeApi) -> kopf.ConnectionInfo:
    """The credentials of ``kube``, for kopf's own API client (the login handler)."""
    cfg = kube.configuration
    header = cfg.get_api_key_with_prefix("BearerToken", alias="authorization")
    scheme, _, token = (header or "").rpartition(" ")
    return kopf.ConnectionInfo(
        server=cfg.host,
        ca_path=cfg.ssl_ca_cert,
        insecure=not cfg.verify_ssl,
        scheme=scheme or ("Bearer" if token else None),
        token=token or None,
        certificate_path=cfg.cert_file,
        private_key_path=cfg.key_file,
    )


def retry_delay(retry: int) -> float:
    """Exponential backoff with jitter for kopf retries: 0.5 s, 1 s, 2 s ... up to 30 s."""
    base: float = min(30.0, 0.5 * 2 ** min(retry, 6))
    return base * random.uniform(0.5, 1.0)


def api_failure(exc: ApiError, retry: int) -> kopf.TemporaryError | kopf.PermanentError:
    """The kopf outcome of a failed API request: permanent when the request is wrong,
    otherwise a retry with backoff (conflicts, throttling, outages)."""
    if exc.permanent:
        return kopf.PermanentError(str(exc))
    return kopf.TemporaryError(str(exc), delay=retry_delay(retry))


@contextmanager
def api_outcomes(retry: int) -> Iterator[None]:
    """Within the block, a failed API request ends the handler with its kopf outcome
    (:func:`api_failure`)."""
    try:
        yield
    except ApiError as exc:
        raise api_failure(exc, retry) from None
