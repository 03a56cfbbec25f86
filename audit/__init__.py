"""End-to-end audit: every tier counts messages and lines per topic per 10-minute window of the
lines' create time and publishes its counts to the audit topic; the reconciler compares them.

Modules, in the order a count travels: :mod:`audit.windows` (counting in memory),
:mod:`audit.records` (the published records), :mod:`audit.publisher` (the flusher and its
sinks), :mod:`audit.ledger` (reading the records back, latest value per key) and
:mod:`audit.reconcile` (tiers compared per window).
"""
