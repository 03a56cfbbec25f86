"""The host daemon: tails log files and ships every line to the gateway exactly once.

Read in the order a line travels: ``config`` (what to tail), ``discovery`` (globs, inotify),
``identity`` (which file is which source), ``tailer`` (reading, chunks at line boundaries,
rotation and truncation), ``codec`` and ``wire`` (the request body), ``transport`` (retries,
backoff, failover), ``daemon`` (the loop that ties them and applies acks), ``state_file``
(acknowledged positions), ``status``, ``metrics`` and ``progress`` (operability).
"""
