"""The gateway: a Starlette app of route modules over a log store (see ``ingest_api.app``).

Reading order of a write: ``settings`` (configuration), ``app`` (assembly), ``write_api``
(the endpoints), ``body`` and ``framing`` (decoding), ``auth`` and ``rate_limit`` (front-door
checks), then ``session_dedup.exactly_once`` (the exactly-once append).
"""
