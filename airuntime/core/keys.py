"""Every Redis key airuntime uses is built here, and only here.

Keeping the schema in one module makes it reviewable (this docstring is the table)
and keeps Lua scripts and Python in agreement about key order.

Slot layout of executions (Redis Cluster: a multi-key script must stay in one slot).
Every execution belongs to a *bucket*, ``crc32(ExecutionId) % B``, and its keys and
the four bucket keys (``executions``, ``executions:active``, ``archive:outbox``,
``early-cancels``) of its bucket share the bucket's hash tag, so the scripts that
create or finalize an execution update the indexes atomically with the transition
(an index never names an execution that is not there or forgets one that is, and a
finalized execution is queued for the archiver exactly once) in one slot. ``B`` is 1
on a standalone server, where the keys are today's ``air:{e:<E>}:*`` and the indexes
``air:executions``, ``air:executions:active``, ``air:archive:outbox``; on a cluster
``B`` = :data:`CLUSTER_EXECUTION_BUCKETS` (128), an execution's keys are
``air:{x:<b>:<n>}:e:<E>:*`` and its bucket's indexes ``air:{x:<b>:<n>}:executions``
(and ``...:executions:active``, ``...:archive:outbox``); the tag ``x:<b>:<n>`` is
chosen so the 128 buckets fall in 128 equal slot ranges (even across shards). Readers
of the indexes (listing, archiver, pruning, metrics) iterate the buckets
(:func:`execution_buckets`). ``air:execution-layout`` records ``B`` the first time an
execution is created; a process that finds another ``B`` refuses to start
(:mod:`airuntime.core.execution_layout`). Everything else keeps its own tag (leases
per scope ``{l:<scope>}``; the control plane's keys: see their rows).

Per execution (hash tag ``{e:<eid>}``, on a cluster ``{x:<b>:<n>}`` with ``:e:<eid>``
after it; no TTL before finalization. Finalization writes the snapshot (every step's
record) and deletes the per-step working keys: a finished execution keeps four keys,
``meta``, ``plan``, ``events`` and ``snapshot`` (:data:`EXECUTION_RECORD_SUFFIXES`).
Archiving off: those get the retention TTL when the execution is finalized. Archiving
on (``archive_hold_s`` in meta): finalization gives them the fallback TTL
``archive_hold_s``, the archiver the retention TTL once archived):

=====================================  ======  =====================================================
key                                    type    content / written by
=====================================  ======  =====================================================
``air:{e:E}:meta``                     hash    status, control, counters (total, done,
                                               completed, failed, skipped, cancelled, running,
                                               waiting_input), timings, tenant, context
                                               snapshot, claim_seq, releasing (releases
                                               left for later calls: parent=next byte,...;
                                               includes/releaseMany). All scripts.
``air:{e:E}:plan``                     string  compiled plan: canonical JSON, zlib above 64 KiB
                                               (``Plan.stored``; workers rebuild it). create.
``air:{e:E}:status``                   hash    step -> pending|ready|running|retry_wait|
                                               input_wait|completed|failed|skipped|cancelled.
``air:{e:E}:pending``                  hash    step -> number of unfinished dependencies. create,
                                               completeSteps, provideInput.
``air:{e:E}:children``                 hash    step -> comma-separated dependents. create.
``air:{e:E}:order``                    hash    step -> topological index (ready-set score). create.
``air:{e:E}:kind``                     hash    step -> ``t`` (throttled) or ``i`` (input);
                                               absent for plain steps. create.
``air:{e:E}:ready``                    zset    claimable plain steps, score = order. readiness.
``air:{e:E}:ready_throttled``          zset    claimable throttled steps, score = order.
``air:{e:E}:delayed``                  zset    WaitingForRetry steps, score = next_retry_at (ms).
``air:{e:E}:running``                  zset    Running steps, score = lease expiry (ms).
``air:{e:E}:attempt``                  hash    step -> current 1-based attempt. failStep.
``air:{e:E}:token``                    hash    step -> claim token of the current owner. claims.
``air:{e:E}:owner``                    hash    step -> finish record ``<ms>|<worker>`` of the last
                                               attempt that ended (completed, failed, stopped,
                                               input provided); the owner alone (no time) of a
                                               claim that expired. A live claim's owner is its
                                               token's prefix (``<owner>#<seq>``).
``air:{e:E}:out``                      hash    step -> output JSON. completeSteps, provideInput.
``air:{e:E}:err``                      hash    step -> last error text. failStep.
``air:{e:E}:times``                    hash    ``c:<step>`` claimed-at ms, ``r:<step>`` next retry
                                               ms (finish times are in ``owner``).
``air:{e:E}:refs``                     hash    step -> comma-separated steps whose outputs it reads
                                               (returned with the claim). create.
``air:{e:E}:max_attempts``             hash    step -> retry budget (only when > 1). create.
``air:{e:E}:events``                   stream  the ledger: one entry per transition.
``air:{e:E}:snapshot``                 string  terminal snapshot JSON. finalization.
=====================================  ======  =====================================================

Global (the first four: one set per execution bucket, see above):

==========================  ======  ========================================================
``air:executions``          zset    execution id -> created ms (listing). createExecution
                                    adds it; :meth:`ExecutionStore.prune_index
                                    <airuntime.engine.execution_store.ExecutionStore.prune_index>`
                                    (the control plane's retention loop) removes the ids
                                    whose execution keys expired. Its owner is the engine.
``air:executions:active``   zset    non-terminal executions: createExecution adds, the
                                    script that finalizes removes (``finalize`` include).
``air:archive:outbox``      zset    finalized executions not yet archived, score = when
                                    due (ms; a claim moves it to the claim lease's
                                    expiry). The ``finalize`` include adds (once, NX) and
                                    trims entries older than the hold (their keys are
                                    gone); claimArchive-1 leases, captureArchive-1
                                    reads, settleArchives-1 removes after the durable
                                    write (history.archiver).
``air:early-cancels``       zset    id -> ms of a cancel that came before its execution:
                                    controlExecution adds (trims after a day),
                                    createExecution takes it and creates it cancelled.
``air:execution-layout``    string  execution bucket count B (1 standalone, 128 cluster),
                                    SET NX by the first store that creates an execution.
``air:{l:<scope>}:holders`` zset    concurrency lease holders of one throttle scope, score =
                                    lease expiry ms. acquireLease/renewLease/releaseLease
                                    (one key each: own slot per scope).
==========================  ======  ========================================================

Slot layout of everything else (issue #17): every Lua script and every MULTI/EXEC
touches keys of one hash slot, so it runs on a Redis Cluster
(:mod:`airuntime.core.slots` refuses a cross-slot call on any server when
``AIRUNTIME_SLOT_CHECK=1``, as the test suite sets). Three kinds of keys:

* **The control slot** ``{air}`` (``CONTROL`` = ``air:{air}``): records that scripts and
  transactions combine with their indexes -- the instance registry, tenant settings,
  shared runs and scale-out requests. Per run this is a few writes (submit, dispatch,
  the end), against the per-step traffic of the execution keys, which spread by
  bucket.
* **Per run bucket** (the runtime run index, sharded by RunId): run ``R`` belongs to
  bucket ``crc32(RunId) % R`` (:data:`CLUSTER_RUN_BUCKETS` = 16 on a cluster, where
  ``air:{air}`` in the run rows below reads ``air:{rb:<b>:<n>}``; 1 on a standalone
  server, where every key keeps its ``air:{air}:*`` name). A RunId is drawn in its
  SharedRunId's bucket, so the record, the mapping, the bucket's state / tenant /
  retention indexes and its outcome stream are one slot for acceptRun-4, startRun-3,
  finishRun-6 and adoptRun-1; readers iterate the buckets; ``air:run-layout`` records
  ``R`` (:mod:`airuntime.core.run_layout`). The local queue of an instance (runs of
  every bucket; on a cluster ``air:{iq:<id>}:queue``) is pushed / cleaned after those
  scripts, and what a crash in between leaves is repaired (:mod:`airuntime.fleet.run_index`).
* **Per tenant** ``{q:<tenant>}``: the shared queue, the control plane's hot path
  (every pump cycle). Each tenant's queue is its own slot; the tenant index
  ``air:{air}:squeue:tenants`` lets the pumps see every tenant
  (:mod:`airuntime.control_plane.queue_tenants` has the protocol that keeps it whole).
* **Single-key** (no tag needed; each key hashes to its own slot, so they spread):
  ``air:instance:<id>:inbox``, ``air:reply:<token>``, ``air:assist:<E>:<inst>``,
  ``air:prefix:<p>:seq``, ``air:control-plane``, ``air:suspect:<inst>``,
  ``air:delivery-failures:<inst>``, and the per-instance ``{r:<inst>}`` reservations.

==================================  ======  ================================================
key                                 type    content / written by
==================================  ======  ================================================
``air:{air}:instances``             zset    runtime instance id -> heartbeat expiry ms (Redis
                                            time). publishInstance-2.lua /
                                            publishInstanceQueued-3.lua add and prune;
                                            unregister (transaction with the descriptor).
``air:{air}:instance:<id>``         string  InstanceDescriptor JSON stamped with Redis time,
                                            PX = heartbeat TTL. publishInstance-2.lua /
                                            publishInstanceQueued-3.lua; unregister;
                                            RunIndex.adopt reads it (alive?).
``air:{air}:tenants``               set     tenant ids with stored settings. registry
                                            (transaction with the settings).
``air:{air}:tenant:<id>:settings``  string  TenantSettings JSON. registry (local YAML /
                                            operator).
``air:{air}:tenant:<id>:secrets``   hash    secret name -> ``{value | sealed,
                                            updated_at_ms, updated_by}`` JSON (sealed:
                                            with AIRUNTIME_SECRETS_KEYS).
                                            putTenantSecret-1.lua (the API's PUT),
                                            resealTenantSecret-1.lua (``airt secrets
                                            reseal``), HDEL (DELETE); runtimes
                                            read values by HMGET right before an
                                            ``http`` step sends (tenant_secrets).
``air:{air}:tenant:<id>:model-tokens`` hash window id, tokens used and reserved in
                                            it, by the tenant's model steps.
                                            modelTokens-2.lua (reserve, settle,
                                            read: model_budget); EXPIREAT a day
                                            after the window ends.
``air:{air}:tenant-seeds``          string  set with the tenants file's settings (same
                                            transaction); gone = Redis lost them, and the
                                            control plane publishes the file again.
``air:{air}:run:<RunId>``           hash    run execution index record + request (run
                                            bucket). acceptRun-4 creates it, startRun-3/
                                            finishRun-6/adoptRun-1 change it; finishRun
                                            sets its TTL = the runtime's run retention
                                            (``AIRUNTIME_RUN_RETENTION_S``, 7 d).
``air:{air}:shared-run:<SRID>``     string  RunId accepted for a SharedRunId. acceptRun-4
                                            (one step with the record); TTL = run retention
                                            from finishRun-6.
``air:{air}:instance:<id>:queue``   list    RunIds accepted by an instance, not yet
                                            started. RunIndex.accept pushes, start/finish
                                            remove, the adoption sweep re-pushes a lost one.
``air:{air}:runs:<state>``          zset    RunIds queued / running (adoption scans).
                                            acceptRun adds, startRun moves, finishRun
                                            removes.
``air:{air}:runs:tenant:<t>``       zset    a tenant's RunIds by creation time. acceptRun
                                            adds; ``RunIndex.prune`` removes entries whose
                                            retention has passed.
``air:{air}:runs:retention``        zset    ``<tenant>:<RunId>`` of finished runs, score =
                                            end of retention (Redis time, ms). finishRun
                                            adds, ``RunIndex.prune`` removes.
``air:{air}:run-outcomes``          stream  one entry per finished runtime run (RunOutcome):
                                            finishRun-6 (MAXLEN ~ OUTCOMES_MAXLEN); the
                                            control plane reads each (consumer group).
``air:run-layout``                  string  run bucket count R, SET NX by the first accept.
``air:{air}:srun:<SRID>``           string  SharedRun JSON. submitSharedRun-7; compare-and-
                                            set transactions (WATCH) with the indexes below.
``air:{air}:idem:<t>:<sha>``        string  ``<SRID> <request fingerprint>`` of tenant t's
                                            submission with an idempotency key (sha-256
                                            of the key, 32 hex). submitSharedRun-7 sets
                                            it with the record, PX the idempotency TTL.
``air:{air}:sruns[:tenant:<t>]``    zset    shared runs by creation time (all / per tenant).
                                            submitSharedRun-7; retention.
``air:{air}:sruns:open``            zset    non-terminal shared runs (reconciler).
                                            submitSharedRun-7; a terminal transition removes.
``air:{air}:sruns:open:tenant``     hash    SharedRunId -> tenant of each open run (where
                                            its queue item is; metrics). Same writers.
``air:{air}:sruns:finished``        zset    terminal shared runs by finish time (retention).
``air:{air}:archive:sruns``         zset    terminal shared runs not yet archived (score =
                                            finish ms): the terminal transition adds, the
                                            control plane's SharedRunArchiver removes.
``air:{air}:scaleout:<id>``         string  ScaleOutRequest JSON; ``air:{air}:scaleouts``
                                            zset index (one transaction).
``air:{air}:squeue:tenants``        zset    tenants whose shared queue may hold work, score
                                            = announce generation. SharedQueue.enqueue
                                            (ZINCRBY after the item), retireQueueTenant-1.
``air:{q:<t>}:pending``             zset    tenant t's Pending items (score = enqueue us,
                                            Redis time of t's shard). Queue scripts.
``air:{q:<t>}:claimed``             zset    tenant t's claimed items (score = claim lease
                                            expiry ms). Queue scripts; recoverSharedRuns-2.
``air:{q:<t>}:item:<SRID>``         hash    queue item status, claim token, counters (the
                                            scripts build it from squeue_item_prefix + SRID).
``air:{r:<inst>}:reservations``     zset    admission reservations of an instance's run
                                            slots. reserveSlot-1, confirmReservation-1.
``air:instance:<id>:inbox``         stream  run requests delivered by the ``redis``
                                            provider (XADD NOMKSTREAM, MAXLEN ~). The
                                            instance creates it with its consumer group,
                                            acknowledges and deletes each entry it answered
                                            (one transaction, one key), keeps a TTL of 10
                                            registration TTLs on it and deletes it on a
                                            graceful stop.
``air:reply:<token>``               list    the instance's answer to one inbox request (the
                                            ``redis`` provider BLPOPs it). RPUSH + EXPIRE
                                            300 s in one transaction, by the instance.
``air:assist:<E>:<inst>``           string  an instance assists execution E (SET NX, PX).
                                            runtime_pod deletes it when the assist ends.
``air:prefix:<p>:seq``              string  counter behind ``<p>-<n>`` instance ids (never
                                            reused; one small key per prefix ever
                                            configured, kept on purpose).
``air:control-plane``               string  control-plane discovery descriptor (TTL).
``air:control``                     pubsub  channel: execution id of every control change
                                            (pause/resume/cancel).
``air:suspect:<inst>``              hash    delivery failures of an instance; while its TTL
                                            runs admission skips the instance.
``air:delivery-failures:<inst>``    hash    consecutive delivery failures / past suspicions
                                            of an instance (TTL). recordDeliveryFailure-1.
==================================  ======  ================================================
"""

from __future__ import annotations

import functools
import hashlib
import zlib
from dataclasses import dataclass

from airuntime.core.bucket_tags import bucket_tags

PREFIX = "air"

CONTROL = f"{PREFIX}:{{air}}"
"""The control tag: the keys the control plane and the fleet combine in scripts and
transactions (records with their indexes), all in one hash slot."""

#: Order of the per-execution keys passed to every execution script (``KEYS[i]``).
EXECUTION_KEY_SUFFIXES: tuple[str, ...] = (
    "meta",
    "plan",
    "status",
    "pending",
    "children",
    "order",
    "kind",
    "ready",
    "ready_throttled",
    "delayed",
    "running",
    "attempt",
    "token",
    "owner",
    "out",
    "err",
    "times",
    "refs",
    "max_attempts",
    "events",
    "snapshot",
)

EXECUTION_RECORD_SUFFIXES: tuple[str, ...] = ("meta", "plan", "events", "snapshot")
"""The keys a finalized execution keeps (the ``finalize`` include deletes the others):
what readers of a finished execution, the archiver and retention deal with."""

CLUSTER_EXECUTION_BUCKETS = 128
"""Execution buckets on a Redis Cluster (1 on a standalone server). Fixed: a
deployment's executions are written under it, see :func:`execution_layout`."""


@dataclass(frozen=True, slots=True)
class ExecutionBucket:
    """One slot's share of the executions and its four keys (see module doc)."""

    index: int
    buckets: int = 1

    @property
    def prefix(self) -> str:
        if self.buckets == 1:
            return PREFIX
        return f"{PREFIX}:{{{bucket_tags(self.buckets, 'x')[self.index]}}}"

    @property
    def executions(self) -> str:
        """Execution id -> created ms (listing)."""
        return f"{self.prefix}:executions"

    @property
    def active(self) -> str:
        """Non-terminal executions."""
        return f"{self.prefix}:executions:active"

    @property
    def outbox(self) -> str:
        """Finalized executions not yet archived (score = when due, ms)."""
        return f"{self.prefix}:archive:outbox"

    @property
    def early_cancels(self) -> str:
        """Cancels that arrived before their execution was created (id -> ms)."""
        return f"{self.prefix}:early-cancels"


def execution_buckets(buckets: int = 1) -> list[ExecutionBucket]:
    """Every bucket of a layout of ``buckets`` (what index readers iterate)."""
    if buckets < 1:
        raise ValueError(f"buckets must be >= 1, not {buckets}")
    return [ExecutionBucket(i, buckets) for i in range(buckets)]


def bucket_of(execution_id: str, buckets: int = 1) -> ExecutionBucket:
    """The bucket of an execution: crc32 of its id, so no lookup is needed."""
    if buckets == 1:
        return ExecutionBucket(0, 1)
    return ExecutionBucket(zlib.crc32(execution_id.encode()) % buckets, buckets)


def execution_layout() -> str:
    """The bucket count the executions were written with, set once and checked by every
    process that creates executions (:mod:`airuntime.core.execution_layout`)."""
    return f"{PREFIX}:execution-layout"


@dataclass(frozen=True, slots=True)
class ExecutionKeys:
    """All keys of one execution, in script order (``buckets``: see module doc)."""

    execution_id: str
    buckets: int = 1

    @property
    def bucket(self) -> ExecutionBucket:
        return bucket_of(self.execution_id, self.buckets)

    @property
    def tag(self) -> str:
        if self.buckets == 1:
            return f"{PREFIX}:{{e:{self.execution_id}}}"
        return f"{self.bucket.prefix}:e:{self.execution_id}"

    def key(self, suffix: str) -> str:
        if suffix not in EXECUTION_KEY_SUFFIXES:
            raise KeyError(f"unknown execution key suffix {suffix!r}")
        return f"{self.tag}:{suffix}"

    def all(self) -> list[str]:
        tag = self.tag
        return [f"{tag}:{s}" for s in EXECUTION_KEY_SUFFIXES]

    def for_script(self, num_keys: int) -> list[str]:
        """KEYS of an execution script taking ``num_keys`` keys: the execution's keys
        (21), then its bucket's active index (22: scripts that can finalize remove the
        execution from it), archive outbox (23: ... and queue it for the archiver),
        list index (24: ``createExecution`` lists it), then early cancels (25: kept
        by ``controlExecution``, applied by ``createExecution``); all in one slot."""
        bucket = self.bucket
        extra = [bucket.active, bucket.outbox, bucket.executions, bucket.early_cancels]
        base = len(EXECUTION_KEY_SUFFIXES)
        if not base <= num_keys <= base + len(extra):
            raise ValueError(f"no execution script takes {num_keys} keys")
        return self.all() + extra[: num_keys - base]

    @property
    def meta(self) -> str:
        return self.key("meta")

    @property
    def plan(self) -> str:
        return self.key("plan")

    @property
    def status(self) -> str:
        return self.key("status")

    @property
    def events(self) -> str:
        return self.key("events")

    @property
    def snapshot(self) -> str:
        return self.key("snapshot")

    @property
    def out(self) -> str:
        return self.key("out")

    @property
    def running(self) -> str:
        return self.key("running")

    @property
    def ready_throttled(self) -> str:
        return self.key("ready_throttled")

    @property
    def token(self) -> str:
        return self.key("token")


def execution_keys(execution_id: str, buckets: int = 1) -> ExecutionKeys:
    return ExecutionKeys(execution_id, buckets)


@functools.lru_cache(maxsize=4096)
def script_keys(execution_id: str, buckets: int, num_keys: int) -> tuple[str, ...]:
    """:meth:`ExecutionKeys.for_script`, kept for the executions in use: a worker calls a
    script of the same execution for every batch it reports (every step of a chain),
    and the 21+ key names are the same every time."""
    return tuple(ExecutionKeys(execution_id, buckets).for_script(num_keys))


def executions_index() -> str:
    """``air:executions`` of a standalone server (bucket 0 of 1)."""
    return ExecutionBucket(0).executions


def active_executions() -> str:
    return ExecutionBucket(0).active


def archive_outbox() -> str:
    """Finalized executions waiting for the archiver (zset, score = due ms); standalone."""
    return ExecutionBucket(0).outbox


def lease_holders(scope: str) -> str:
    """Holders of one throttle scope's concurrency leases (own hash slot per scope)."""
    return f"{PREFIX}:{{l:{scope}}}:holders"


def instances() -> str:
    return f"{CONTROL}:instances"


def instance(instance_id: str) -> str:
    return f"{CONTROL}:instance:{instance_id}"


def tenants() -> str:
    return f"{CONTROL}:tenants"


def tenant_settings(tenant_id: str) -> str:
    return f"{CONTROL}:tenant:{tenant_id}:settings"


def tenant_secrets(tenant_id: str) -> str:
    """Tenant ``tenant_id``'s secrets (:mod:`airuntime.engine.tenant_secrets`)."""
    return f"{CONTROL}:tenant:{tenant_id}:secrets"


def tenant_model_tokens(tenant_id: str) -> str:
    """Tenant ``tenant_id``'s model tokens in the current budget window
    (:mod:`airuntime.engine.model_budget`)."""
    return f"{CONTROL}:tenant:{tenant_id}:model-tokens"


def tenant_seeds() -> str:
    return f"{CONTROL}:tenant-seeds"


CLUSTER_RUN_BUCKETS = 16
"""Run index buckets on a Redis Cluster (1 standalone). Fixed: see :func:`run_layout`."""


@dataclass(frozen=True, slots=True)
class RunBucket:
    """One slot's share of the runtime run index (see module doc)."""

    index: int
    buckets: int = 1

    @property
    def prefix(self) -> str:
        if self.buckets == 1:
            return CONTROL
        return f"{PREFIX}:{{{bucket_tags(self.buckets, 'rb')[self.index]}}}"

    def run(self, run_id: str) -> str:
        return f"{self.prefix}:run:{run_id}"

    def shared_run_to_run(self, shared_run_id: str) -> str:
        return f"{self.prefix}:shared-run:{shared_run_id}"

    def in_state(self, state: str) -> str:
        return f"{self.prefix}:runs:{state}"

    def by_tenant(self, tenant_id: str) -> str:
        return f"{self.prefix}:runs:tenant:{tenant_id}"

    @property
    def retention(self) -> str:
        return f"{self.prefix}:runs:retention"

    @property
    def outcomes(self) -> str:
        return f"{self.prefix}:run-outcomes"


def run_buckets(buckets: int = 1) -> list[RunBucket]:
    """Every run bucket of a layout of ``buckets`` (what index readers iterate)."""
    if buckets < 1:
        raise ValueError(f"buckets must be >= 1, not {buckets}")
    return [RunBucket(i, buckets) for i in range(buckets)]


def run_bucket_of(run_or_shared_run_id: str, buckets: int = 1) -> RunBucket:
    """The bucket of a RunId or a SharedRunId (crc32 of the id)."""
    if buckets == 1:
        return RunBucket(0, 1)
    return RunBucket(zlib.crc32(run_or_shared_run_id.encode()) % buckets, buckets)


def run_layout() -> str:
    """The run bucket count, set once like :func:`execution_layout`."""
    return f"{PREFIX}:run-layout"


def run(run_id: str, buckets: int = 1) -> str:
    return run_bucket_of(run_id, buckets).run(run_id)


def shared_run_to_run(shared_run_id: str, buckets: int = 1) -> str:
    return run_bucket_of(shared_run_id, buckets).shared_run_to_run(shared_run_id)


def instance_queue(instance_id: str, buckets: int = 1) -> str:
    """An instance's local queue: the control slot standalone, ``{iq:<id>}`` on a cluster."""
    if buckets == 1:
        return f"{CONTROL}:instance:{instance_id}:queue"
    return f"{PREFIX}:{{iq:{instance_id}}}:queue"


def instance_inbox(instance_id: str) -> str:
    return f"{PREFIX}:instance:{instance_id}:inbox"


def reply_list(token: str) -> str:
    """Where a runtime instance answers one request of its inbox."""
    return f"{PREFIX}:reply:{token}"


def assist_lease(execution_id: str, instance_id: str) -> str:
    """Held while ``instance_id`` assists another instance's execution."""
    return f"{PREFIX}:assist:{execution_id}:{instance_id}"


def prefix_sequence(prefix: str) -> str:
    """The counter that numbers the instance ids ``<prefix>-<n>``."""
    return f"{PREFIX}:prefix:{prefix}:seq"


def shared_run(shared_run_id: str) -> str:
    return f"{CONTROL}:srun:{shared_run_id}"


def shared_runs() -> str:
    return f"{CONTROL}:sruns"


def submit_idempotency(tenant_id: str, idempotency_key: str) -> str:
    """Tenant ``tenant_id``'s submission made with ``idempotency_key`` (hashed: any
    key, one bounded name; the tenant in the name keeps tenants' keys apart)."""
    digest = hashlib.sha256(idempotency_key.encode()).hexdigest()[:32]
    return f"{CONTROL}:idem:{tenant_id}:{digest}"


def shared_runs_by_tenant(tenant_id: str) -> str:
    return f"{CONTROL}:sruns:tenant:{tenant_id}"


def squeue_tag(tenant_id: str) -> str:
    """One tenant's shared queue tag: its zsets and items in one slot, tenants spread."""
    return f"{PREFIX}:{{q:{tenant_id}}}"


def squeue_pending(tenant_id: str) -> str:
    return f"{squeue_tag(tenant_id)}:pending"


def squeue_claimed(tenant_id: str) -> str:
    return f"{squeue_tag(tenant_id)}:claimed"


def squeue_item_prefix(tenant_id: str) -> str:
    return f"{squeue_tag(tenant_id)}:item:"


def squeue_item(tenant_id: str, shared_run_id: str) -> str:
    return f"{squeue_item_prefix(tenant_id)}{shared_run_id}"


def squeue_tenants() -> str:
    """Tenants whose shared queue may hold work (zset, score = announce generation):
    what the pumps walk to see every tenant's queue."""
    return f"{CONTROL}:squeue:tenants"


def reservations(instance_id: str) -> str:
    return f"{PREFIX}:{{r:{instance_id}}}:reservations"


def scale_out_request(request_id: str) -> str:
    return f"{CONTROL}:scaleout:{request_id}"


def scale_out_requests() -> str:
    return f"{CONTROL}:scaleouts"


def control_plane() -> str:
    return f"{PREFIX}:control-plane"


def control_channel() -> str:
    """Pub/sub channel announcing execution control changes (payload: execution id)."""
    return f"{PREFIX}:control"


def suspect_instance(instance_id: str) -> str:
    """Delivery-failure record of an instance that admission should skip for a while."""
    return f"{PREFIX}:suspect:{instance_id}"


def shared_runs_open() -> str:
    """Shared runs not yet in a terminal status (zset, score = creation ms): what the
    control plane's reconciler looks at."""
    return f"{CONTROL}:sruns:open"


def shared_runs_open_tenants() -> str:
    """The tenant of each open shared run (hash SharedRunId -> tenant id): where its
    queue item is (``air:{q:<tenant>}:item:<SharedRunId>``), for readers that walk
    the open index."""
    return f"{CONTROL}:sruns:open:tenant"


def shared_runs_finished() -> str:
    """Shared runs in a terminal status (zset, score = finished ms): what retention prunes."""
    return f"{CONTROL}:sruns:finished"


def shared_run_archive_outbox() -> str:
    """Terminal shared runs waiting for the control plane's archiver (zset)."""
    return f"{CONTROL}:archive:sruns"


def delivery_failures(instance_id: str) -> str:
    """Consecutive delivery failures and past suspicions of an instance (hash, TTL): the
    memory behind :func:`suspect_instance` marks."""
    return f"{PREFIX}:delivery-failures:{instance_id}"
