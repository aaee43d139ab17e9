"""runtime_pod: the runtime instance process (``airt runtime``).

:mod:`~runtime_pod.host` hosts instances and their HTTP API (:mod:`~runtime_pod.http_api`);
an instance (:mod:`~runtime_pod.instance`) takes runs through :mod:`~runtime_pod.intake`
(also from its Redis inbox, :mod:`~runtime_pod.inbox`), runs each in a participation
(:mod:`~runtime_pod.participation`, waiting Redis out with :mod:`~airuntime.core.transient`),
adopts and assists (:mod:`~runtime_pod.adoption`) and bounds step handlers
(:mod:`~runtime_pod.step_slots`, settings in :mod:`~runtime_pod.settings_store`).
:mod:`~runtime_pod.environment` keeps credentials from the steps.
"""
