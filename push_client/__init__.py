"""The host daemon: tails log files and ships every line to the gateway exactly once.

Read in the order a line travels: ``config`` (what to tail), ``discovery`` (globs, inotify),
``identity`` (which file is which source), ``tailer`` (reading, chunks at line boundaries),
``files`` (the set of tailed files: rotation, truncation, letting go) and ``rotation`` (the
grace of a renamed file), ``codec`` and ``wire`` (the request body), ``shipper`` (sessions,
writes and their answers), ``transport`` (retries, backoff, failover across one
installation's gateways), ``installations`` and ``handover`` (failover across installations,
each line in one), ``parking`` (files the gateway refuses), ``token``, ``daemon`` (the loop
that ties them), ``state_file`` (acknowledged positions), ``status``, ``metrics`` and
``progress`` (operability).
"""
