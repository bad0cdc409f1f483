"""Training: one loop for pretraining and fine-tuning. Follow one step: train.py (run ->
train_loop) -> step.py (train_step), with state.py for the state it steps.

  train.py       the loop: the workdir, its lock, the parts, the steps and what is due after each
  step.py        the jitted train and eval steps and their contract; the losses
  state.py       the TrainState and its optimizer: from scratch or a checkpoint, or restored
  layer_decay.py the optimizer's layer-wise learning-rate decay (BEiT, timm)
  outputs.py     what a run leaves: its checkpoint loaded for inference, final.npz
  check.py       one check of a whole run config, a table per section, before anything runs
  check_data.py  its checks that read: the data's sizes, the init_from file
  stopping.py    why a run stops early: signals all processes agree on, non-finite values
  report.py      console lines, TensorBoard scalars, summary.json, throughput
  compiled.py    what the compiler says of the step: bytes, FLOPs, time; the TPU chips' figures
  planner.py     the loop's step compiled for a TPU topology: bytes, FLOPs, time
  abstract.py    the loop's step with abstract arguments; the tokens attention runs on
  miniature.py   the paper's recipe in miniature (pretrain -> fine-tune vs scratch)
"""
