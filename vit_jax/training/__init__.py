"""Training: one loop for pretraining and fine-tuning. Follow one step: train.py (run ->
train_loop -> train_step), with state.py for the state it steps.

  train.py      the loop and the jitted step, with their jit contract
  state.py      the TrainState and its optimizer: from scratch or a checkpoint, restored, exported
  check.py      one check of a whole run config, a table per section, before anything runs
  stopping.py   why a run stops early: signals all processes agree on, non-finite values
  report.py     console lines, TensorBoard scalars, summary.json, throughput
  compiled.py   what the compiler says of the step: bytes, FLOPs, time; the TPU chips' figures
  planner.py    the loop's step compiled for a TPU topology: bytes, FLOPs, time
  miniature.py  the paper's recipe in miniature (pretrain -> fine-tune vs scratch)
"""
