"""A run's own files, local or on an object store (not the files people pass around:
those are `vit_jax.weights`).

  workdir.py      where a run's files are; before training: writable, free space, finished
  checkpoints.py  the Orbax checkpoints: a save with its integrity record, listing,
                  the newest intact one
  record.py       the integrity record: CRC-32 of every array shard, the file sizes
  shards.py       the record's CRC-32 of every array shard, gathered over processes
  verify.py       restoring only what verifies (damaged ones set aside), verify
  lock.py         one run per workdir: run.lock names the holder, a heartbeat, takeover
"""
