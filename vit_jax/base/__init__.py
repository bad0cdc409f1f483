"""Plain helpers that know nothing of models.

  store.py     one path type for disks and buckets (gs://, s3://); their operations, each
               retried through a run's window; what a store's failure means
  clients.py   the object stores' clients, set up once for the process (on this room's import)
  failures.py  what kind of failure a store's error is: transient, the store's own, or neither
  files.py     files and directories written whole or not at all
  outage.py    a store that stops answering: the run's retry window, its probe, exit 75
  problems.py  config rules, and config values that cannot make sense, all named at once
  console.py   durations, sizes and short lists in messages; progress bars; silenced stderr;
               a thread that calls a function every N seconds
  exits.py     how a command ends: one `error:` line and exit 1, Ctrl-C's line and 130
Everything above them imports these; they import nothing of the package.
"""

from vit_jax.base import clients

clients.configure()  # before any module of the package makes a path or opens a store
