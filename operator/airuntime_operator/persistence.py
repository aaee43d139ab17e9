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
  ScaleOutRequests (handled once, on creation) keep kopf's annotation.
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
    """For ``observed`` kinds, the handled spec is the generation the status observed.

    The essence kopf compares is ``{"metadata": {"generation": N}}``: built from
    ``metadata.generation``, fetched from ``status.observedGeneration`` (none yet: the
    object was never handled, a creation), and never stored -- the handler writes
    ``observedGeneration`` itself once the spec is handled. A spec change is thus a
    diff until handled; status and metadata writes never are.

    ``annotated`` kinds keep kopf's last-handled-configuration annotation. Any other
    kind (only indexed: no handler looks at its changes) has an empty essence, which
    spares kopf a deep copy of every such object on every event.
    """

    def __init__(
        self, *, observed: Iterable[str], annotated: Iterable[str], prefix: str, key: str
    ) -> None:
        super().__init__(prefix=prefix, key=key)
        self.observed, self.annotated = frozenset(observed), frozenset(annotated)

    def build(
        self, *, body: kopf.Body, extra_fields: Iterable[Any] | None = None
    ) -> kopf.BodyEssence:
        kind = body.get("kind")
        if kind in self.observed:
            return _essence(body.metadata.get("generation"))
        if kind in self.annotated:
            return super().build(body=body, extra_fields=extra_fields)
        return kopf.BodyEssence()

    def fetch(self, *, body: kopf.Body) -> kopf.BodyEssence | None:
        kind = body.get("kind")
        if kind in self.observed:
            observed = body.status.get("observedGeneration")
            return None if observed is None else _essence(observed)
        if kind in self.annotated:
            return super().fetch(body=body)
        return kopf.BodyEssence()

    def store(self, *, body: kopf.Body, patch: kopf.Patch, essence: kopf.BodyEssence) -> None:
        if body.get("kind") in self.annotated:
            super().store(body=body, patch=patch, essence=essence)


def _essence(generation: Any) -> kopf.BodyEssence:
    return cast(kopf.BodyEssence, {"metadata": {"generation": generation}})
