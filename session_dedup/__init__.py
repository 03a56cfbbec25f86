"""Sources, pins and seqnos: the exactly-once write of chunks into the partitioned log.

``source`` validates what identifies a source, ``pinning`` chooses and remembers its partition,
``seqno_table`` keeps its last written seqno beside the data, ``envelope`` encodes each chunk,
and ``exactly_once`` ties them into one transaction per source and request.
"""
