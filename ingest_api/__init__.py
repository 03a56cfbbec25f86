"""The gateway: a Starlette app of route modules over a log store (see ``ingest_api.app``).

Reading order of a write: ``settings`` (configuration), ``app`` (assembly), ``access`` (every
route's permission, checked before its body is read) and ``auth`` (tokens), ``write_api`` (the
endpoints), ``body`` and ``framing`` (decoding), ``rate_limit``, then
``session_dedup.exactly_once`` (the exactly-once append).  The other route tables:
``read_api``, ``groups_api``, ``subscriptions_api``, ``replica_api``, ``legacy_api``,
``admin_api``.
"""
