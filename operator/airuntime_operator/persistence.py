"""Where kopf keeps what it knows of a resource: nothing extra when a handler succeeds.

Why this module: by default kopf records, in the object itself, the spec it last
handled (its *diff base*, to tell a real change from a status write) and every
handler's progress (to retry). Each is a PATCH of the object on top of the status
patch the handler makes anyway -- for a RuntimePool that was a second PATCH per
reconcile, which dominated the operator's API cost at scale.

* A RuntimePool's status already says which spec was handled: ``observedGeneration``
  (the API server bumps ``metadata.generation`` on every spec change and never on a
  status or metadata write). :class:`ObservedGenerationDiffBase` makes that kopf's
  diff base for pools: "handled" is ``status.observedGeneration == generation``,
  written by the reconcile handler in its status patch, so storing it costs nothing.
  Other kinds (ScaleOutRequests) keep kopf's annotation.
* :class:`ProgressAnnotations` keeps handler progress in annotations as before, minus
  kopf's ``<prefix>/kopf-managed`` branding marker: a handler that succeeds on its
  first try stores progress and purges it in the same patch, so without the marker
  that patch is empty and never sent. Retries (failures) still record their progress.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, cast

import kopf

__all__ = ["ObservedGenerationDiffBase", "ProgressAnnotations"]


class ProgressAnnotations(kopf.AnnotationsProgressStorage):
    """kopf's annotation progress storage without the ``kopf-managed`` marker."""

    def _store_marker(self, prefix: str, patch: kopf.Patch, body: kopf.Body) -> None:
        """No marker: it would turn a first-try success into a PATCH of its own."""


class ObservedGenerationDiffBase(kopf.AnnotationsDiffBaseStorage):
    """For objects of ``kinds``, the handled spec is the generation the status observed.

    The essence kopf compares is ``{"metadata": {"generation": N}}``: built from
    ``metadata.generation``, fetched from ``status.observedGeneration`` (none yet: the
    object was never handled, a creation), and never stored -- the handler writes
    ``observedGeneration`` itself once the spec is handled. A spec change is thus a
    diff until handled; status and metadata writes never are. Other kinds use kopf's
    last-handled-configuration annotation.
    """

    def __init__(self, *, kinds: Iterable[str], prefix: str, key: str) -> None:
        super().__init__(prefix=prefix, key=key)
        self.kinds = frozenset(kinds)

    def _tracks(self, body: kopf.Body) -> bool:
        return body.get("kind") in self.kinds

    def build(
        self, *, body: kopf.Body, extra_fields: Iterable[Any] | None = None
    ) -> kopf.BodyEssence:
        if not self._tracks(body):
            return super().build(body=body, extra_fields=extra_fields)
        return _essence(body.metadata.get("generation"))

    def fetch(self, *, body: kopf.Body) -> kopf.BodyEssence | None:
        if not self._tracks(body):
            return super().fetch(body=body)
        observed = body.status.get("observedGeneration")
        return None if observed is None else _essence(observed)

    def store(self, *, body: kopf.Body, patch: kopf.Patch, essence: kopf.BodyEssence) -> None:
        if not self._tracks(body):
            super().store(body=body, patch=patch, essence=essence)


def _essence(generation: Any) -> kopf.BodyEssence:
    return cast(kopf.BodyEssence, {"metadata": {"generation": generation}})
