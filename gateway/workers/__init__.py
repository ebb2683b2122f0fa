"""Worker processes: one gateway that uses every core (`[server] workers = N`).

A supervisor (`supervisor`) holds what makes the processes one gateway: the
SQLite file's lock, the listening ports (reserved with SO_REUSEPORT, so every
worker listens on the same one and the kernel spreads connections), the
metrics directory and the wire between workers (`channel`). Each worker
(`child`) is a whole gateway process of its own with its own event loop,
store connections and group commits; towards the store it is an owner with
leases, as a PostgreSQL replica is.
"""
