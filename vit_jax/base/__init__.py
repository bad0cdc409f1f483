"""Plain helpers that know nothing of models.

  store.py     one path type for disks and buckets (gs://, s3://); their operations, each
               retried through a run's window; what a store's failure means
  files.py     files and directories written whole or not at all
  outage.py    a store that stops answering: the run's retry window, its probe, exit 75
  problems.py  config rules, and config values that cannot make sense, all named at once
  console.py   durations, sizes and short lists in messages; progress bars; silenced stderr;
               a thread that calls a function every N seconds
  exits.py     how a command ends: one `error:` line and exit 1, Ctrl-C's line and 130
Everything above them imports these; they import nothing of the package.
"""
