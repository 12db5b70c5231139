"""The local-disk tier kind, whole: ``kind`` (config options and the two halves), ``ledger``
(scheduler side: slots, the file's lock, recovery on restart), ``io`` (worker side: records
read and written), ``format`` (the file and record layout), ``inventory`` (``kvoffload cache``)."""
