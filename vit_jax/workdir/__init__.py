"""A run's own files, local or on an object store (not the files people pass around:
those are `vit_jax.weights`).

  workdir.py      where a run's files are; before training: writable, free space, finished
  checkpoints.py  the Orbax checkpoints: saves with their integrity record, verified
                  restore (damaged ones set aside), the newest intact one, verify
  record.py       the integrity record: CRC-32 of every array shard, the file sizes
  lock.py         one run per workdir: run.lock names the holder, a heartbeat, takeover
"""
