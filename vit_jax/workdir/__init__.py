"""A run's own checkpoints, in `workdir/checkpoints/<step>` (not the files people pass
around: those are `vit_jax.weights`).

  manager.py    the Orbax manager, in one place: saving and restore-only
  integrity.py  the record beside each checkpoint: CRC-32 of every array and file;
                the newest intact checkpoint and the sentence that names it
  saver.py      saves that write the record before Orbax commits; failed saves named
  recovery.py   verified restore: damaged checkpoints set aside, fall back, verify
  checks.py     before training: a writable workdir, free space, a finished run
  lock.py       one run per workdir: run.lock names the holder, a heartbeat, takeover
"""
